"""Agent turns across a daemon restart (issue 13 item 5; ``dshd.agent.resume``), end to end: a
real ``python -m dshd`` with the scripted model, a real sandboxed tool call, SIGTERM
(``on_stop = "detach"``) or SIGKILL, a real start.

A turn whose step waits for a long tool call when the daemon goes resumes after the start: the
call runs on in its call host, its real result lands in the log, the next model step follows
and the turn ends ``completed`` — one turn, one run of the command. A turn whose model request
was in flight ends ``interrupted``. Every test ends the daemon and its call hosts
(``DshdProcess.close``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import pytest
import trio

from client.api import connect
from dshd.agent.history import build_messages
from tests.agent.helpers import (
    WAIT_S, DaemonProcess, approve_all, events_of, turn_events, wait_turn_end, wait_until,
)

class Ev(NamedTuple):
    type: str
    data: dict


# Runs until the test opens its gate (the file ``go``) once dshd is back, so the command ends
# while dshd runs (a fixed sleep could end before a slow restart did). Bounded: 60 s. It may end
# before the host is re-attached: its result must not then say dshd was away.
BUILD = ("echo ran >> marker.txt; i=0; while [ ! -e go ] && [ $i -lt 1200 ]; do sleep 0.05; "
         "i=$((i+1)); done; echo built-$((6 * 7))")


@pytest.fixture
def root():
    root = Path(tempfile.mkdtemp(prefix="dsh-askt-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def workdir(root):
    w = root / "work"
    w.mkdir()
    return w


def scripted(root: Path, *responses: dict) -> str:
    """A dshd.toml whose model is the scripted provider with ``responses``."""
    script = root / "script.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in responses))
    return f'log_level = "info"\n[model]\nprovider = "scripted"\nscript = "{script}"\n'


def sandbox_of(c) -> str:
    return "workspace-write" if c.server["sandbox"]["provider"] != "none" \
        else "danger-full-access"


async def start_turn(daemon: DaemonProcess, workdir: Path, ready) -> tuple[str, str]:
    """Create a session, start a turn with an answerer allowing its calls; return once
    ``ready(lane_view)`` holds: ``(sessionId, turnId)``."""
    async with connect(daemon.socket, "answerer", approvals=True) as ans, \
            connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), sandbox=sandbox_of(c))
        async with trio.open_nursery() as nursery:
            sub = await nursery.start(approve_all, ans, sid)
            turn_id = await c.start_turn(sid, "build it")
            await wait_until(lambda: ready(sub.mirror.value))  # approve_all reads the views
            nursery.cancel_scope.cancel()
    return sid, turn_id


async def approvals(sub) -> dict:
    """The lane's ``approvals`` once it shows one (bounded): read view by view."""
    with trio.fail_after(WAIT_S):
        view = await sub.next_view()
        while not view.get("approvals"):
            view = await sub.next_view()
        return dict(view["approvals"])


def tool_running(view) -> bool:
    return any(t["state"] == "running" for t in (view or {}).get("tools", {}).values())


@pytest.mark.parametrize("how", ["term", "kill9"])
async def test_a_turn_waiting_on_a_long_call_resumes_after_a_restart(root, workdir, how):
    daemon = DaemonProcess(root, scripted(
        root, {"text": "Building.", "toolCalls": [{"name": "bash",
                                                   "arguments": {"command": BUILD}}]},
        {"text": "Built: the answer is 42."}))
    marker = workdir / "marker.txt"
    daemon.start()
    try:
        sid, turn_id = await start_turn(daemon, workdir, tool_running)
        await wait_until(marker.exists)
        daemon.kill9() if how == "kill9" else daemon.stop()
        daemon.start()
        (workdir / "go").write_text("")  # the build ends now, with dshd running
        async with connect(daemon.socket) as c:
            end = await wait_turn_end(c, sid, turn_id)
            events = await events_of(c, sid)
    finally:
        daemon.close()
    assert end["data"] == {"turnId": turn_id, "reason": "completed"}
    turn = turn_events(events, turn_id)
    assert [e["type"] for e in turn] == [
        "turn/start", "message/user", "step/start", "message/assistant", "tool/call",
        "approval/asked", "approval/decided", "tool/result", "step/end", "step/start",
        "message/assistant", "step/end", "turn/end"]
    result = next(e["data"] for e in turn if e["type"] == "tool/result")
    assert result["content"] == "built-42\n" and result["exitCode"] == 0
    assert "errorCode" not in result
    assert turn[-3]["data"]["text"] == "Built: the answer is 42."
    assert marker.read_text() == "ran\n"  # the command ran once
    assert sum(e["type"] == "turn/start" for e in events) == 1
    # What the model was shown for its second step: the call's real result, right after it.
    messages = build_messages([Ev(e["type"], e["data"]) for e in turn[:-3]], "system")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[3]["content"] == "built-42\n[exit code: 0]"


async def test_a_turn_whose_call_waited_for_approval_resumes_once_it_is_allowed(root, workdir):
    """The step's call waits for approval when dshd stops: after the start the call is asked
    again (same approvalId) and the turn waits for it; allowing it runs the command once and the
    turn goes on to ``completed``."""
    daemon = DaemonProcess(root, scripted(
        root, {"text": "Marking.", "toolCalls": [{"name": "bash", "arguments": {
            "command": "echo ran >> marker.txt; echo marked"}}]}, {"text": "Marked."}))
    marker = workdir / "marker.txt"
    daemon.start()
    try:
        async with connect(daemon.socket, "answerer", approvals=True) as ans, \
                connect(daemon.socket) as c:
            sid = await c.create_session(str(workdir), sandbox=sandbox_of(c))
            sub = await ans.subscribe(sid)
            turn_id = await c.start_turn(sid, "mark it")
            (aid,) = await approvals(sub)
            daemon.stop()  # SIGTERM with the answerer attached: the approval stays undecided
        daemon.start()
        async with connect(daemon.socket, "late answerer", approvals=True) as ans, \
                connect(daemon.socket) as c:
            sub = await ans.subscribe(sid)
            assert list(await approvals(sub)) == [aid]  # asked again: the same approvalId
            assert await ans.decide(sid, aid, "allow") == "allowed-once"
            end = await wait_turn_end(c, sid, turn_id)
            events = await events_of(c, sid)
    finally:
        daemon.close()
    assert end["data"] == {"turnId": turn_id, "reason": "completed"}
    assert marker.read_text() == "ran\n"
    turn = turn_events(events, turn_id)
    asked = [e["data"]["approvalId"] for e in turn if e["type"] == "approval/asked"]
    assert asked == [aid]
    result = next(e["data"] for e in turn if e["type"] == "tool/result")
    assert result["content"] == "marked\n" and result["exitCode"] == 0
    assert turn[-3]["data"]["text"] == "Marked."


@pytest.mark.parametrize("how", ["term", "kill9"])
async def test_a_turn_whose_model_request_was_in_flight_ends_interrupted(root, workdir, how):
    daemon = DaemonProcess(root, scripted(root, {"text": "word " * 300, "paceMs": 200}))
    daemon.start()
    try:
        sid, turn_id = await start_turn(
            daemon, workdir, lambda v: ((v or {}).get("turn") or {}).get("text"))
        daemon.kill9() if how == "kill9" else daemon.stop()
        daemon.start()
        async with connect(daemon.socket) as c:
            end = await wait_turn_end(c, sid, turn_id)
            events = await events_of(c, sid)
    finally:
        daemon.close()
    assert end["data"]["reason"] == "interrupted"
    types = [e["type"] for e in turn_events(events, turn_id)]
    assert types[:3] == ["turn/start", "message/user", "step/start"]
    assert types[-2:] == ["step/end", "turn/end"] and "tool/call" not in types


async def test_a_resumed_turns_lane_names_its_calls_with_their_states(root, workdir):
    """After a detaching stop and a start, the resumed turn's lane ``turn.calls`` comes from the
    log and the re-adopted call: the call with its name, ``running``; then ``settled`` with its
    exit code once it ends (issue 15: a client re-joining after a restart sees where it is)."""
    gate = workdir / "gate"
    command = f"echo ran >> marker.txt; while [ ! -f {gate} ]; do sleep 0.05; done; echo built"
    daemon = DaemonProcess(root, scripted(
        root, {"text": "Building.", "toolCalls": [{"name": "bash",
                                                   "arguments": {"command": command}}]},
        {"text": "Built."}))
    marker = workdir / "marker.txt"
    daemon.start()
    try:
        sid, turn_id = await start_turn(daemon, workdir, tool_running)
        await wait_until(marker.exists)
        daemon.stop()
        daemon.start()
        async with connect(daemon.socket) as c:
            sub = await c.subscribe(sid)
            with trio.fail_after(WAIT_S):
                view = await sub.next_view()
                while not (view["turn"] and view["turn"]["calls"]):
                    view = await sub.next_view()
                resumed = [dict(call) for call in view["turn"]["calls"]]
                gate.write_text("")
                while view["turn"] and view["turn"]["calls"][0]["state"] != "settled":
                    view = await sub.next_view()
                settled = dict(view["turn"]["calls"][0]) if view["turn"] else None
            end = await wait_turn_end(c, sid, turn_id)
    finally:
        daemon.close()
    assert end["data"]["reason"] == "completed"
    (call,) = resumed
    assert call["name"] == "bash" and call["state"] == "running"
    assert view is not None and settled == {**call, "state": "settled", "exitCode": 0}
