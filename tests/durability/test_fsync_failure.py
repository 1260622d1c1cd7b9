"""fsync fails (EIO, injected) under a running dshd: the barrier fails closed -- the command
never starts, the call settles STORAGE_FAILURE, the client is told -- and once fsync works
again the session carries on with everything earlier intact (STORAGE.md §4, EXEC.md §1).

dshd runs in-process here so that ``os.fsync`` can be swapped under it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from client.api import connect
from dshd.config import load_config
from dshd.server import serve
from dshd.storage import read_log
from protocol.rpc import STORAGE_FAILURE, RpcError

from .helpers import all_events, as_dicts, assert_paired


class FsyncSwitch:
    """Replaces ``os.fsync`` (the one dshd.storage calls) with one that can fail."""

    def __init__(self, monkeypatch) -> None:
        self.failing = False
        self.failed = 0
        real = os.fsync

        def fsync(fd: int) -> None:
            if self.failing:
                self.failed += 1
                raise OSError(errno.EIO, "injected EIO")
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)


async def _start(nursery, root: Path):
    config = load_config(None, socket=str(root / "run" / "dshd.sock"),
                         state_dir=str(root / "state"), log_format="json")
    return await nursery.start(serve, config)


async def test_fsync_failure_fails_closed_then_recovers(root, workdir, monkeypatch):
    switch = FsyncSwitch(monkeypatch)
    sock = root / "run" / "dshd.sock"
    marker = workdir / "ran"
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            sid = await c.create_session(str(workdir))
            one = await c.run_tool(sid, "echo one", approved=True)
            assert (await c.wait(sid, one))["content"] == "one\n"
            durable_before = await all_events(c, sid)

            switch.failing = True
            two = await c.run_tool(sid, f"echo ran > {marker}; echo two", approved=True)
            with trio.fail_after(30):
                try:
                    result = await c.wait(sid, two)
                except RpcError as exc:  # the result itself could not be made durable
                    assert exc.code == STORAGE_FAILURE
                else:
                    assert result["isError"] is True and result["errorCode"] == "STORAGE_FAILURE"
                    assert result.get("exitCode") is None
                    assert result["content"] and "two" not in result["content"]  # a sentence
            assert not marker.exists()  # the barrier held: the body never started
            # Other durable requests fail loudly, with the storage failure code.
            with pytest.raises(RpcError) as err:
                await c.call("session.setApprovalPolicy", {"sessionId": sid, "policy": "ask"})
            assert err.value.code == STORAGE_FAILURE
            assert switch.failed > 0

            switch.failing = False
            three = await c.run_tool(sid, f"echo three; cat {marker} 2>/dev/null", approved=True)
            assert (await c.wait(sid, three))["content"] == "three\n"
            assert not marker.exists()
            # The failed call is settled for good, and was never run, not even late.
            settled = await c.wait(sid, two)
            assert settled["errorCode"] == "STORAGE_FAILURE"
            await c.call("session.setApprovalPolicy", {"sessionId": sid, "policy": "ask"})
            events = await all_events(c, sid)
            assert events[: len(durable_before)] == durable_before
            assert_paired(events, root / "state" / "sessions" / sid)
            assert [e["data"]["callId"] for e in events if e["type"] == "tool/call"] == [
                one, two, three]
        nursery.cancel_scope.cancel()

    read = read_log(root / "state" / "sessions" / sid, sid)
    assert not read.torn
    on_disk = as_dicts(read.events)
    assert on_disk[: len(events)] == events
    # In-process restart: the same events, nothing re-run.
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            assert (await all_events(c, sid))[: len(events)] == events
            assert (await c.wait(sid, one))["content"] == "one\n"
            assert (await c.wait(sid, two))["errorCode"] == "STORAGE_FAILURE"
        nursery.cancel_scope.cancel()
    assert not marker.exists()


async def test_session_create_fails_when_fsync_fails(root, workdir, monkeypatch):
    switch = FsyncSwitch(monkeypatch)
    sock = root / "run" / "dshd.sock"
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            switch.failing = True
            with pytest.raises(RpcError) as err:
                await c.create_session(str(workdir), title="doomed")
            assert err.value.code == STORAGE_FAILURE
            switch.failing = False
            sid = await c.create_session(str(workdir), title="fine")
            cid = await c.run_tool(sid, "echo ok", approved=True)
            assert (await c.wait(sid, cid))["exitCode"] == 0
            assert [i["sessionId"] for i in await c.list_sessions()] == [sid]
        nursery.cancel_scope.cancel()
    # The session the client was told failed never appears, not even after a restart.
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            assert [i["sessionId"] for i in await c.list_sessions()] == [sid]
        nursery.cancel_scope.cancel()


async def test_result_that_cannot_be_made_durable_is_not_claimed(root, workdir, monkeypatch):
    switch = FsyncSwitch(monkeypatch)
    sock = root / "run" / "dshd.sock"
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            sid = await c.create_session(str(workdir))
            cid = await c.run_tool(sid, "echo started; sleep 0.5; echo done", approved=True)
            sub = await c.subscribe(sid)
            with trio.fail_after(20):
                async for view in sub:
                    tool = view["tools"].get(cid)
                    if tool and tool["state"] == "running" and "started" in \
                            tool["output"]["content"][0]["text"]:
                        break
            switch.failing = True  # the body runs; its tool/result will not become durable
            with trio.fail_after(30):
                try:
                    result = await c.wait(sid, cid)
                except RpcError as exc:
                    assert exc.code == STORAGE_FAILURE
                else:
                    assert result["isError"] is True, f"claimed success: {result}"
            switch.failing = False
            result = await c.wait(sid, cid)  # durable now (the flush is retried)
            assert result["exitCode"] == 0 and result["content"] == "started\ndone\n"
            read = read_log(root / "state" / "sessions" / sid, sid)
            assert read.events[-1].type == "tool/result" and read.events[-1].data == result
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("taken_back", ["retracted", "compensated"])
async def test_failed_policy_change_changes_nothing(root, workdir, monkeypatch, taken_back):
    """-32014 for session.setApprovalPolicy means the policy did not change: not in
    session.get, not on the lane, not after the fault clears, not after a restart."""
    from dshd.storage.writer import SessionLog

    if taken_back == "compensated":  # as if another event had been appended after it
        monkeypatch.setattr(SessionLog, "retract", lambda self, first, last: False)
    switch = FsyncSwitch(monkeypatch)
    sock = root / "run" / "dshd.sock"
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            sid = await c.create_session(str(workdir), approval_policy="never")
            switch.failing = True
            with pytest.raises(RpcError) as err:
                await c.set_policy(sid, "ask")
            assert err.value.code == STORAGE_FAILURE
            assert (await c.get_session(sid))["approvalPolicy"] == "never"
            async with await c.subscribe(sid) as sub:
                view = await sub.next_view()
            assert view["session"]["approvalPolicy"] == "never"
            switch.failing = False
            # The fault cleared: the buffered batch is written by the next flush, and still
            # the policy is the old one.
            cid = await c.run_tool(sid, "echo ok", approved=True)
            assert (await c.wait(sid, cid))["content"] == "ok\n"
            assert (await c.get_session(sid))["approvalPolicy"] == "never"
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            assert (await c.get_session(sid))["approvalPolicy"] == "never"
            await c.set_policy(sid, "ask")  # the retry works
            assert (await c.get_session(sid))["approvalPolicy"] == "ask"
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            assert (await c.get_session(sid))["approvalPolicy"] == "ask"
        nursery.cancel_scope.cancel()
    policies = [e.data["policy"] for e in read_log(root / "state" / "sessions" / sid, sid).events
                if e.type == "approval/policy"]
    assert policies[-1] == "ask"
    assert policies == (["never", "ask"] if taken_back == "retracted"
                        else ["never", "ask", "never", "ask"])
