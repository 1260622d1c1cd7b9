"""Graceful stop with calls in every state (PROTOCOL.md §3.6, EXEC.md §1, STORAGE.md §5).

With ``on_stop = "cancel"`` each call settles with the code of the state it was in, durably,
so a restarted daemon reads the results from the log with nothing left for the crash repair.
With ``on_stop = "detach"`` (the default, HOST.md §7) a running call and a call waiting for
approval are left for the next daemon: nothing is recorded for them. Harness: ``conftest.py``."""

from __future__ import annotations

import json

import pytest
import trio

from dshd.storage.reader import read_log

from .conftest import running_daemon


@pytest.fixture
def daemon_overrides() -> dict:
    """The old stop unless a test says otherwise (``on_stop = "cancel"``)."""
    return {"on_stop": "cancel"}


def output(lane, call_id: str) -> str:
    tool = lane.tool(call_id)
    return tool["output"]["content"][0]["text"] if tool else ""


async def _results(wire, session_id: str) -> dict[str, dict]:
    events = (await wire.call("session.events", {"sessionId": session_id}))["events"]
    return {e["data"]["callId"]: e["data"] for e in events if e["type"] == "tool/result"}


async def test_shutdown_settles_calls_in_every_state(daemon, daemon_clock, nursery, fsync_gate,
                                                      tmp_path):
    wire = await daemon.connect(approvals=True, nursery=nursery)
    sid = await daemon.create_session(wire, approvalPolicy="ask")
    lane = await wire.subscribe(sid)
    marker = daemon.workdir / "ran"

    done = await wire.run(sid, "echo done")  # settled
    assert (await wire.wait(sid, done))["content"] == "done\n"
    running = await wire.run(sid, "echo started; sleep 1000")  # running
    await wire.wait_lane(lane, lambda l: "started" in output(l, running), "the running call")
    asking = await wire.run(sid, f"touch {marker}", approved=False)  # waiting for approval
    await wire.wait_lane(lane, lambda l: l.approval_for(asking), "the approval request")
    slow = await daemon.create_session(wire)  # a second session, its disk slow:
    fsync_gate.hold(slow)
    in_barrier = await wire.run(slow, f"touch {marker}")  # its call waits in the barrier
    await fsync_gate.wait_held()

    async with trio.open_nursery() as stopping:
        stopping.start_soon(daemon.stop)
        # The healthy session's calls settle on the lane while the slow disk still holds.
        await wire.wait_lane(lane, lambda l: l.recent(running) and l.recent(asking),
                             "the running and the asking call to settle")
        assert lane.recent(running)["errorCode"] == "TOOL_CANCELLED"
        assert lane.recent(asking)["errorCode"] == "APPROVAL_CANCELLED"
        fsync_gate.release()
    assert not marker.exists()

    async with running_daemon(tmp_path, daemon.config, daemon_clock) as again:
        reader = await again.connect(nursery=nursery)
        results = await _results(reader, sid)
        assert set(results) == {done, running, asking}
        assert results[done].get("errorCode") is None and results[done]["exitCode"] == 0
        assert results[running]["errorCode"] == "TOOL_CANCELLED"
        assert results[running]["content"] == "started\n"
        assert results[asking]["errorCode"] == "APPROVAL_CANCELLED"
        slow_results = await _results(reader, slow)
        assert set(slow_results) == {in_barrier}
        assert slow_results[in_barrier]["errorCode"] == "ABORTED_BEFORE_DISPATCH"
        # The same answers through tool.wait, at once.
        assert (await reader.wait(sid, running, timeout=0))["errorCode"] == "TOOL_CANCELLED"
        assert (await reader.wait(slow, in_barrier, timeout=0))["errorCode"] == (
            "ABORTED_BEFORE_DISPATCH")


async def test_shutdown_ends_a_running_turn_interrupted(daemon, daemon_clock, nursery, tmp_path):
    wire = await daemon.connect(approvals=True, nursery=nursery)
    sid = await daemon.create_session(wire)
    lane = await wire.subscribe(sid)
    turn_id = (await wire.call("turn.start", {"sessionId": sid, "input": "hello"}))["turnId"]
    # The demo script's first step proposes a bash call: it waits at the gate.
    await wire.wait_lane(lane, lambda l: l.value["approvals"], "the model call's gate")
    await daemon.stop()
    async with running_daemon(tmp_path, daemon.config, daemon_clock) as again:
        reader = await again.connect(nursery=nursery)
        events = (await reader.call("session.events", {"sessionId": sid}))["events"]
        ends = [e["data"] for e in events if e["type"] == "turn/end"]
        assert ends == [{"turnId": turn_id, "reason": "interrupted",
                         "message": "dshd stopped during the turn"}]
        [result] = [e["data"] for e in events if e["type"] == "tool/result"]
        assert result["errorCode"] == "APPROVAL_CANCELLED"


@pytest.mark.parametrize("daemon_overrides", [{"kill_grace_seconds": 30.0, "on_stop": "cancel",
                                               "stop_timeout_seconds": 10.0}])
async def test_a_call_that_ignores_term_cannot_stretch_the_stop(daemon, daemon_clock, nursery,
                                                                tmp_path, daemon_overrides):
    """The stop budget bounds the calls too: a command that ignores SIGTERM under a kill grace
    longer than the budget is SIGKILLed when the budget runs out, and still settles durably."""
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    lane = await wire.subscribe(sid)
    stubborn = await wire.run(sid, "trap '' TERM; echo started; while :; do sleep 0.05; done")
    await wire.wait_lane(lane, lambda l: "started" in output(l, stubborn), "the running call")
    began = trio.current_time()
    await daemon.stop()
    took = trio.current_time() - began
    assert took <= daemon.config.stop_timeout_seconds, (
        f"the stop took {took:.1f} s of a {daemon.config.stop_timeout_seconds} s budget")
    async with running_daemon(tmp_path, daemon.config, daemon_clock) as again:
        reader = await again.connect(nursery=nursery)
        result = await reader.wait(sid, stubborn, timeout=0)
        assert result["errorCode"] == "TOOL_CANCELLED" and result["content"] == "started\n"


async def test_a_stop_sends_every_answer_in_flight(daemon, daemon_clock, nursery):
    """PROTOCOL.md §1: responses are never dropped. Twenty pipelined tool.waits on one
    connection, settled by the stop, are all answered before the connection closes."""
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    lane = await wire.subscribe(sid)
    call_id = await wire.run(sid, "echo started; sleep 1000")
    await wire.wait_lane(lane, lambda l: "started" in output(l, call_id), "the running call")
    waits = [wire.request_object("tool.wait", {"sessionId": sid, "callId": call_id})
             for _ in range(20)]
    for message in waits:
        await wire.send(message)
    await daemon.stop()
    answers = [wire.answer(message["id"]) for message in waits]
    assert all(a is not None for a in answers), (
        f"{sum(a is None for a in answers)} of 20 answers were dropped at the stop")
    assert {a["result"]["errorCode"] for a in answers} == {"TOOL_CANCELLED"}


@pytest.mark.parametrize("daemon_overrides", [{"on_stop": "detach"}])
async def test_a_request_during_a_detaching_stop_does_not_reopen_the_session(
        daemon, daemon_clock, nursery, daemon_overrides):
    """A client still connected during the stop names the session after it closed (a
    ``tool.wait``, a reconnecting answerer): it is told the daemon stops (-32014), and the
    session is not opened again -- a reopened one re-asked its pending approval in the dying
    daemon and cancelled it at its end (``approval/decided cancelled``), so the call never ran
    after the restart."""
    wire = await daemon.connect(approvals=True, nursery=nursery)
    sid = await daemon.create_session(wire, approvalPolicy="ask")
    lane = await wire.subscribe(sid)
    asking = await wire.run(sid, f"touch {daemon.workdir / 'ran'}", approved=False)
    await wire.wait_lane(lane, lambda l: l.approval_for(asking), "the approval request")
    session = daemon.daemon.registry.open[sid]
    answers: list = []

    async def stop() -> None:
        await daemon.stop_sessions()

    async with trio.open_nursery() as stopping:
        stopping.start_soon(stop)
        await session.finished.wait()
        answers.append(await wire.error("session.get", {"sessionId": sid}))
    await daemon.stop()
    [err] = answers
    assert err.code == -32014 and "stopping" in err.message, err
    events = read_log(daemon.state_dir / "sessions" / sid, sid).events
    assert not [e for e in events if e.type == "approval/decided"], events


@pytest.mark.parametrize("daemon_overrides", [{"on_stop": "detach"}])
async def test_a_detaching_stop_leaves_running_and_asking_calls(daemon, daemon_clock, nursery,
                                                                fsync_gate, daemon_overrides):
    """``on_stop = "detach"``: the running call's host runs on with no ``tool/result`` and no
    ``terminate``; the asking call's ``approval/asked`` stays undecided (no ``cancelled``);
    the call in the barrier (nothing ran) is aborted as before."""
    wire = await daemon.connect(approvals=True, nursery=nursery)
    sid = await daemon.create_session(wire, approvalPolicy="ask")
    lane = await wire.subscribe(sid)
    marker = daemon.workdir / "ran"
    running = await wire.run(sid, "echo started; sleep 1000")
    await wire.wait_lane(lane, lambda l: "started" in output(l, running), "the running call")
    asking = await wire.run(sid, f"touch {marker}", approved=False)
    await wire.wait_lane(lane, lambda l: l.approval_for(asking), "the approval request")
    slow = await daemon.create_session(wire)
    fsync_gate.hold(slow)
    in_barrier = await wire.run(slow, f"touch {marker}")
    await fsync_gate.wait_held()
    call_dir = daemon.state_dir / "sessions" / sid / "calls" / running
    host = json.loads((call_dir / "host.json").read_text())
    assert host["onDaemonLoss"] == "keep"
    alive_after_stop = []

    async def stop() -> None:
        await daemon.stop_sessions()
        alive_after_stop.append(proc_alive(host))

    async with trio.open_nursery() as stopping:
        stopping.start_soon(stop)
        # The slow session has applied the stop (its barrier call is cancelled) before its
        # disk answers: checkpoints only, no virtual time (a held fsync's thread stops it).
        sessions = list(daemon.daemon.registry.open.values())
        while not all(s._calls.stopping for s in sessions):
            await trio.lowlevel.checkpoint()
        fsync_gate.release()
    await daemon.stop()
    assert alive_after_stop == [True], "the detached call's host must run on"
    assert not marker.exists()
    events = read_log(daemon.state_dir / "sessions" / sid, sid).events
    assert [e.data["callId"] for e in events if e.type == "tool/result"] == []
    [asked] = [e.data for e in events if e.type == "approval/asked"
               and e.data["callId"] == asking]
    assert not [e for e in events if e.type == "approval/decided"
                and e.data["approvalId"] == asked["approvalId"]]
    slow_events = read_log(daemon.state_dir / "sessions" / slow, slow).events
    [aborted] = [e.data for e in slow_events if e.type == "tool/result"]
    assert aborted["callId"] == in_barrier
    assert aborted["errorCode"] == "ABORTED_BEFORE_DISPATCH"


def proc_alive(record: dict) -> bool:
    from dshd.callhost import tree

    st = tree.proc_stat(record["pid"])
    return st is not None and st.start_time == record["startTime"]
