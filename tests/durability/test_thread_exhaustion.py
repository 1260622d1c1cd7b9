"""Thread exhaustion (a fork bomb's RLIMIT_NPROC) under a running dshd: the writer's worker
thread cannot start. That is a storage failure that fails closed with the real reason, never a
crash: every tool.wait returns, a known result stays known (it is kept buffered and written by
the retry, never repaired to TOOL_OUTCOME_UNKNOWN), other sessions keep their own results.

dshd runs in-process (real socket, real files) so that trio's thread spawn can fail under it:
``ThreadSpawnSwitch`` refuses the storage room's worker threads exactly as the C library does.
"""

from __future__ import annotations

import pytest
import trio

from client.api import connect
from dshd.storage import Header, SessionLog, StorageWriteError, read_log
from protocol.rpc import STORAGE_FAILURE, RpcError

from .helpers import ThreadSpawnSwitch, all_events, assert_paired
from .test_fsync_failure import _start


async def test_thread_exhaustion_fails_the_write_closed_and_keeps_the_batch(root, monkeypatch):
    switch = ThreadSpawnSwitch(monkeypatch)
    state_dir = root / "state"
    first = SessionLog.create(state_dir, "s1", Header(id="s1", createdAt=1, cwd="/srv"))
    first.append("turn/start", {"turnId": "t0"})
    await first.aclose()
    path = first.path
    log = await SessionLog.open_for_write(state_dir, "s1")
    before = path.read_bytes()
    switch.failing = True
    ev = log.append("turn/start", {"turnId": "t9"})
    for _ in range(3):  # every retry fails the same honest way; none crashes
        with pytest.raises(StorageWriteError) as info:
            await log.flush()
        message = str(info.value)
        assert "can't start new thread" in message and "RLIMIT_NPROC" in message
        assert "stay buffered" in message
    assert switch.refused == 3
    assert log.statistics()["buffered"] == 1 and log.durable_seq == ev.seq - 1
    assert path.read_bytes() == before
    with pytest.raises(OSError) as opened:  # opening another session: the same reason
        await SessionLog.open_for_write(state_dir, "s2")
    assert "RLIMIT_NPROC" in str(opened.value)
    switch.failing = False
    assert await log.flush() == ev.seq  # the kept batch is written by the retry
    await log.aclose()
    assert read_log(path.parent, "s1").events[-1] == ev


async def _wait_fails_closed(c, sid: str, cid: str) -> dict | None:
    """tool.wait answers (bounded): the result, or -32014 naming the limit."""
    with trio.fail_after(30):
        try:
            return await c.wait(sid, cid)
        except RpcError as exc:
            assert exc.code == STORAGE_FAILURE
            assert "RLIMIT_NPROC" in exc.message and "can't start new thread" in exc.message
            return None


async def test_thread_exhaustion_fails_closed_and_keeps_known_results(root, workdir, monkeypatch):
    switch = ThreadSpawnSwitch(monkeypatch)
    sock = root / "run" / "dshd.sock"
    marker = workdir / "ran"
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            a = await c.create_session(str(workdir), approval_policy="never")
            b = await c.create_session(str(workdir), approval_policy="never")
            running = await c.run_tool(a, "sleep 1; echo finished", approved=True)
            async with await c.subscribe(a) as sub:  # its barrier passed: it runs
                with trio.fail_after(30):
                    async for view in sub:
                        if (view["tools"].get(running) or {}).get("state") == "running":
                            break
            switch.failing = True  # its result will meet the exhaustion
            blocked = await c.run_tool(b, f"touch {marker}; echo never", approved=True)
            got_blocked = await _wait_fails_closed(c, b, blocked)
            got_running = await _wait_fails_closed(c, a, running)
            assert switch.refused > 0
            if got_blocked is not None:  # known: it never started, and says why
                assert got_blocked["errorCode"] == "STORAGE_FAILURE"
                assert "RLIMIT_NPROC" in got_blocked["content"]
            assert got_running is None  # its result is known but not durable: not claimed
            assert not marker.exists()  # the barrier held
            assert (await c.status())["pid"] > 0  # the daemon answers meanwhile
            switch.failing = False
            # The batch was kept: the retry writes the results the daemon knew.
            with trio.fail_after(30):
                done = await c.wait(a, running)
                never = await c.wait(b, blocked)
            assert done["exitCode"] == 0 and done["content"] == "finished\n"
            assert never["errorCode"] == "STORAGE_FAILURE" and "RLIMIT_NPROC" in never["content"]
            # Both sessions go on.
            for sid in (a, b):
                cid = await c.run_tool(sid, "echo again", approved=True)
                assert (await c.wait(sid, cid))["content"] == "again\n"
                assert_paired(await all_events(c, sid), root / "state" / "sessions" / sid)
        nursery.cancel_scope.cancel()
    assert not marker.exists()
    for sid, cid, code in ((a, running, None), (b, blocked, "STORAGE_FAILURE")):
        results = [e.data for e in read_log(root / "state" / "sessions" / sid, sid).events
                   if e.type == "tool/result" and e.data["callId"] == cid]
        assert len(results) == 1 and results[0].get("errorCode") == code  # never UNKNOWN
