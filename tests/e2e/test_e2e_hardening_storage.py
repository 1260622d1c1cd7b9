"""Issue 10, storage side, against real dshd processes on real sockets: a crashed session is
supervised (item 2b) and the locks cannot be deleted away (item 10).

The crash is injected through dshd's test hook ``DSH_TEST_FAULT=KIND:TOKEN`` (read once at
daemon start, inert when unset; ``dshd.sessions.session.TestFault``): the session task named
by KIND raises while a call whose command contains TOKEN is in the lane.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import trio

from client.api import connect
from dshd.storage import read_log
from dshd.testing import DshdProcess
from protocol.rpc import STORAGE_FAILURE, RpcError

from .conftest import DaemonProcess, wait_until_gone

CRASH_WORDS = "the session crashed (InjectedFault: injected test fault"


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="dsh-hs-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def log_lines(daemon: DshdProcess) -> list[dict]:
    out = []
    for line in daemon.log_path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


async def wait_running(c, sid: str, cid: str) -> None:
    async with await c.subscribe(sid) as sub:
        with trio.fail_after(30):
            async for view in sub:
                tool = view["tools"].get(cid)
                if tool and tool["state"] == "running":
                    break


@pytest.mark.parametrize("kind", ["publish-crash", "settle-crash"])
async def test_a_crashed_session_settles_its_calls_and_reopens(root, workdir, monkeypatch, kind):
    token = "crash" + secrets.token_hex(6)
    marker = "long" + secrets.token_hex(6)  # must not contain the token
    monkeypatch.setenv("DSH_TEST_FAULT", f"{kind}:{token}")
    daemon = DaemonProcess(root)
    daemon.start()
    try:
        async with connect(daemon.socket) as c:
            a = await c.create_session(str(workdir), title="crashes", approval_policy="never")
            b = await c.create_session(str(workdir), title="bystander", approval_policy="never")
            first = await c.run_tool(a, "echo first")
            assert (await c.wait(a, first))["content"] == "first\n"
            sleeper = await c.run_tool(a, f"sleep 60; : {marker}")
            await wait_running(c, a, sleeper)
            bystander = await c.run_tool(b, "sleep 1; echo bystander")
            follower = await c.subscribe(a)  # follows the lane across the crash
            # The call that trips the fault: the publisher (or its own task) raises.
            tripper = await c.run_tool(a, f"echo {token}")
            with trio.fail_after(30):
                long = await c.wait(a, sleeper)
                trip = await c.wait(a, tripper)
                # The follower gets the reopened lane: both calls left `tools` for `recent`.
                async for view in follower:
                    recent = {r["callId"]: r for r in view["recent"]}
                    if not view["tools"] and sleeper in recent and tripper in recent:
                        break
            assert recent[sleeper]["errorCode"] == "TOOL_CANCELLED"
            await follower.aclose()
            assert long["errorCode"] == "TOOL_CANCELLED" and long["isError"] is True
            assert CRASH_WORDS in long["message"] and "process group was killed" in long["message"]
            if kind == "publish-crash":
                assert trip["errorCode"] in ("TOOL_CANCELLED", "ABORTED_BEFORE_DISPATCH")
                assert CRASH_WORDS in (trip.get("message") or trip["content"])
            else:  # it crashed while settling: its own result is what it really was
                assert trip["exitCode"] == 0 and trip["content"] == f"{token}\n"
            assert wait_until_gone(marker) == []
            # The other session never noticed.
            assert (await c.wait(b, bystander))["content"] == "bystander\n"
            again = await c.run_tool(b, "echo b-again")
            assert (await c.wait(b, again))["content"] == "b-again\n"
            # The next request reopens the crashed session from its log, and it works.
            info = await c.get_session(a)
            assert info["running"] == 0
            after = await c.run_tool(a, "echo after")
            assert (await c.wait(a, after))["content"] == "after\n"
            assert (await c.wait(a, sleeper)) == long  # settled for good, and durable
            assert (await c.wait(a, tripper)) == trip
            events = [ev async for ev in c.iter_events(a)]
        calls = [e["data"]["callId"] for e in events if e["type"] == "tool/call"]
        results = {e["data"]["callId"]: e["data"] for e in events if e["type"] == "tool/result"}
        assert calls == [first, sleeper, tripper, after] and set(results) == set(calls)
        assert results[sleeper] == long  # the result the client got is the one on disk
    finally:
        daemon.close()
    crashed = [e for e in log_lines(daemon) if e.get("event") == "session.crashed"]
    assert len(crashed) == 1 and crashed[0]["session"] == a
    assert "InjectedFault" in crashed[0]["error"]
    read = read_log(daemon.state_dir / "sessions" / a, a)
    assert [e.type for e in read.events].count("tool/result") == 4


async def test_a_value_the_lane_refuses_never_wedges_the_session(daemon, workdir):
    """The issue's reproduction: whatever the boundary answers for an integer JSON cannot carry
    exactly, the session goes on: no phantom call, no -32005, running calls settle."""
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), approval_policy="never")
        running = await c.run_tool(sid, "sleep 2; echo survived")
        with pytest.raises(RpcError) as err:
            await c.call("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                      "arguments": {"command": "true", "n": 9007199254740993}})
        assert err.value.code in (-32602, -32603)
        with trio.fail_after(30):
            assert (await c.wait(sid, running))["content"] == "survived\n"
            for _ in range(3):
                info = await c.get_session(sid)
            assert info["running"] == 0
            after = await c.run_tool(sid, "echo after")
            assert (await c.wait(sid, after))["content"] == "after\n"
        events = [ev async for ev in c.iter_events(sid)]
    calls = [e["data"]["callId"] for e in events if e["type"] == "tool/call"]
    results = [e["data"]["callId"] for e in events if e["type"] == "tool/result"]
    assert sorted(calls) == sorted(results)  # every recorded call has its result


async def test_fault_hook_is_inert_when_unset(daemon, workdir):
    assert "DSH_TEST_FAULT" not in os.environ
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), approval_policy="never")
        cid = await c.run_tool(sid, "echo publish-crash")
        assert (await c.wait(sid, cid))["content"] == "publish-crash\n"
    assert not [e for e in log_lines(daemon) if e.get("event") in ("session.crashed",
                                                                   "test_fault.enabled")]


def _wait_exit(proc: subprocess.Popen, seconds: float) -> int | None:
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return None


async def test_deleted_lock_files_do_not_let_a_second_daemon_in(daemon, workdir):
    state = daemon.state_dir
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), approval_policy="never")
        one = await c.run_tool(sid, "echo one")
        assert (await c.wait(sid, one))["content"] == "one\n"
        session_dir = state / "sessions" / sid
        os.unlink(state / "dshd.lock")
        os.unlink(session_dir / "session.lock")

        second = DshdProcess(daemon.root, state_dir=state, socket_path=daemon.root / "r2" / "d.sock")
        second.log_path = daemon.root / "second.log"
        proc = second.spawn()
        rc = _wait_exit(proc, 30)
        if rc is None:
            proc.kill()
            proc.wait()
        assert rc not in (None, 0), "a second dshd started on a state dir that is in use"
        message = second.log_path.read_text()
        assert f"process {daemon.pid}" in message and "only one dshd" in message
        assert not (daemon.root / "r2" / "d.sock").exists()

        # Somebody puts a new session.lock in place: the first daemon notices before it
        # writes again, stops writing and says why.
        (session_dir / "session.lock").write_text("99999\n")
        before = (session_dir / "session.v1.jsonl.zst").read_bytes()
        two = await c.run_tool(sid, "echo two > two.txt")
        with trio.fail_after(30):
            with pytest.raises(RpcError) as err:
                await c.wait(sid, two)
        assert err.value.code == STORAGE_FAILURE
        assert "removed or replaced" in err.value.message
        with pytest.raises(RpcError) as err2:
            await c.set_policy(sid, "ask")
        assert err2.value.code == STORAGE_FAILURE
        assert not (workdir / "two.txt").exists()  # the barrier held: nothing ran
        assert (session_dir / "session.v1.jsonl.zst").read_bytes() == before
        # Other sessions (their locks intact) keep working.
        other = await c.create_session(str(workdir), approval_policy="never")
        three = await c.run_tool(other, "echo three")
        assert (await c.wait(other, three))["content"] == "three\n"
    lost = [e for e in log_lines(daemon) if e.get("event") == "storage.lock_lost"]
    assert len(lost) == 1 and lost[0]["session"] == sid and "removed or replaced" in lost[0]["reason"]
    assert daemon.proc.poll() is None
