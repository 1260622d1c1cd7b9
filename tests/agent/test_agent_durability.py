"""The agent loop and the log's durability: kill -9 while a model-proposed tool runs, and a
flush that fails before the model request (fault injection)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from client.api import connect
from tests.agent.fake_model_server import text_reply, tool_reply
from tests.agent.helpers import (
    WAIT_S,
    DaemonProcess,
    approve_all,
    events_of,
    fast_model,
    kill_call_hosts,
    kill_session_processes,
    model_toml,
    sandbox_mode,
    turn_events,
    wait_turn_end,
    wait_until,
)


@pytest.fixture
def crash_root():
    root = Path(tempfile.mkdtemp(prefix="dsh-ag9-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


async def test_kill9_during_a_model_proposed_call_then_resume(fake_model, crash_root, workdir):
    """dshd dies (SIGKILL) while a model-proposed tool runs, and the call's host dies too while
    dshd is down (a host that lives on is re-adopted instead: tests/agent/test_agent_restart.py).
    After the restart the next turn's request holds a result for every earlier call — the
    repaired one TOOL_OUTCOME_UNKNOWN — and nothing ran twice (the marker file has one line)."""
    daemon = DaemonProcess(crash_root, model_toml(fast_model(fake_model.url)))
    marker = workdir / "marker.txt"
    fake_model.script(
        tool_reply([("bash", {"command": "echo ran >> marker.txt; sleep 600"})], text="On it."),
        text_reply("The last call's outcome is unknown; I will check before anything else."),
    )
    sid = None
    daemon.start()
    try:
        async with connect(daemon.socket, "answerer", approvals=True) as ans, \
                connect(daemon.socket) as c:
            mode = "workspace-write" if c.server["sandbox"]["provider"] != "none" \
                else "danger-full-access"
            sid = await c.create_session(str(workdir), sandbox=mode)
            async with trio.open_nursery() as nursery:
                sub = await nursery.start(approve_all, ans, sid)
                t1 = (await c.call("turn.start", {"sessionId": sid, "input": "mark it"}))["turnId"]
                await wait_until(lambda: marker.exists())
                with trio.fail_after(WAIT_S):
                    while not any(t["state"] == "running"
                                  for t in sub.mirror.value["tools"].values()):
                        await sub.next_view()
                daemon.kill9()  # mid-call: no turn/end, no tool/result
                assert kill_call_hosts(daemon.state_dir, sid) == 1  # before its command:
                kill_session_processes(sid)  # no exit.json, so the outcome is unknown
                nursery.cancel_scope.cancel()

        daemon.start()
        async with connect(daemon.socket) as c:
            t2 = (await c.call("turn.start", {"sessionId": sid, "input": "go on"}))["turnId"]
            end = await wait_turn_end(c, sid, t2)
            events = await events_of(c, sid)
    finally:
        daemon.close()
        if sid is not None:
            kill_session_processes(sid)

    assert end["data"]["reason"] == "completed"
    assert marker.read_text() == "ran\n"  # written once: nothing was re-run
    # Repair closed the first turn: TOOL_OUTCOME_UNKNOWN, step/end, turn/end interrupted.
    first = turn_events(events, t1)
    (call,) = [e["data"] for e in first if e["type"] == "tool/call"]
    (result,) = [e["data"] for e in events if e["type"] == "tool/result"]
    assert result["callId"] == call["callId"] and result["errorCode"] == "TOOL_OUTCOME_UNKNOWN"
    assert [e["type"] for e in first][-3:] == ["tool/result", "step/end", "turn/end"]
    assert first[-1]["data"] == {"turnId": t1, "reason": "interrupted"}
    # The request after the restart: every call in it has its result, right after it.
    (_, request) = fake_model.bodies()
    messages = request["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[2]["tool_calls"][0]["id"] == call["callId"]
    assert messages[3]["tool_call_id"] == call["callId"]
    assert "TOOL_OUTCOME_UNKNOWN" in messages[3]["content"]
    assert "may or may not have run" in messages[3]["content"]
    assert messages[4] == {"role": "user", "content": "go on"}
    called = {tc["id"] for m in messages for tc in m.get("tool_calls", [])}
    answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    assert called == answered


async def test_a_failed_flush_before_the_model_request_sends_nothing(
        dshd, fake_model, workdir, monkeypatch):
    """Fault injection: fsync of the session log fails. The pre-step barrier fails closed: the
    fake server receives nothing and the turn ends with error STORAGE_FAILURE. Once the disk
    heals, the next turn goes through."""
    fake_model.script(text_reply("only after the disk healed"))
    async with connect(dshd.config.socket) as c:
        sid = await c.create_session(str(workdir), sandbox=sandbox_mode(dshd))

        def failing_fsync(fd: int) -> None:  # FAULT INJECTION
            raise OSError(errno.EIO, "injected fsync failure")

        monkeypatch.setattr(os, "fsync", failing_fsync)
        t1 = (await c.call("turn.start", {"sessionId": sid, "input": "hello"}))["turnId"]
        end = await wait_turn_end(c, sid, t1)  # session.events includes the unflushed tail
        assert fake_model.requests == []
        monkeypatch.undo()  # the disk heals

        t2 = (await c.call("turn.start", {"sessionId": sid, "input": "again"}))["turnId"]
        end2 = await wait_turn_end(c, sid, t2)
        events = await events_of(c, sid)
    assert end["data"]["reason"] == "error" and end["data"]["errorCode"] == "STORAGE_FAILURE"
    assert "nothing was started" in end["data"]["message"]
    assert [e["type"] for e in turn_events(events, t1)] == [
        "turn/start", "message/user", "step/start", "step/end", "turn/end"]
    assert end2["data"]["reason"] == "completed"
    (body,) = fake_model.bodies()
    assert [m["content"] for m in body["messages"][1:]] == ["hello", "again"]


async def test_a_graceful_stop_interrupts_the_turn(fake_model, crash_root, workdir):
    """SIGTERM with ``on_stop = "cancel"`` while a model-proposed call runs: dshd itself cancels
    the call (TOOL_CANCELLED) and ends the turn ``interrupted`` before it exits; no repair is
    needed on restart. (With the default ``detach`` the turn resumes instead:
    tests/agent/test_agent_restart.py.)"""
    daemon = DaemonProcess(crash_root, 'on_stop = "cancel"\n'
                           + model_toml(fast_model(fake_model.url)))
    fake_model.script(tool_reply([("bash", {"command": "touch started; sleep 600"})]))
    daemon.start()
    sid = None
    try:
        async with connect(daemon.socket, "answerer", approvals=True) as ans, \
                connect(daemon.socket) as c:
            mode = "workspace-write" if c.server["sandbox"]["provider"] != "none" \
                else "danger-full-access"
            sid = await c.create_session(str(workdir), sandbox=mode)
            async with trio.open_nursery() as nursery:
                await nursery.start(approve_all, ans, sid)
                t1 = (await c.call("turn.start", {"sessionId": sid, "input": "wait"}))["turnId"]
                await wait_until(lambda: (workdir / "started").exists())
                nursery.cancel_scope.cancel()
        daemon.stop()  # SIGTERM: graceful
        daemon.start()
        async with connect(daemon.socket) as c:
            events = await events_of(c, sid)
    finally:
        daemon.close()
        if sid is not None:
            kill_session_processes(sid)
    evs = turn_events(events, t1)
    (result,) = [e["data"] for e in evs if e["type"] == "tool/result"]
    assert result["errorCode"] == "TOOL_CANCELLED"
    assert [e["type"] for e in evs][-3:] == ["tool/result", "step/end", "turn/end"]
    assert evs[-1]["data"]["reason"] == "interrupted"
    assert "dshd stopped" in evs[-1]["data"]["message"]  # written by dshd, not by repair
