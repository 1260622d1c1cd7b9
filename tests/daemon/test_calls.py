"""Tool calls through the wire (EXEC.md §1, PROTOCOL.md §3.2–§3.4): cancel at each stage of
gate → barrier → exec, and a model call the turn loop refuses. Harness: ``conftest.py``."""

from __future__ import annotations

import pytest


def output(lane, call_id: str) -> str:
    tool = lane.tool(call_id)
    return tool["output"]["content"][0]["text"] if tool else ""


async def test_cancel_while_waiting_for_approval(daemon, daemon_clock, nursery):
    answerer = await daemon.connect(approvals=True, nursery=nursery)
    sid = await daemon.create_session(answerer, approvalPolicy="ask")
    lane = await answerer.subscribe(sid)
    marker = daemon.workdir / "ran"
    call_id = await answerer.run(sid, f"touch {marker}", approved=False)
    approval_id, asked = await answerer.wait_lane(
        lane, lambda l: l.approval_for(call_id), "the approval request")
    assert asked["summary"] == f"touch {marker}"
    assert lane.tool(call_id)["state"] == "waiting-approval"

    assert await answerer.call("tool.cancel", {"sessionId": sid, "callId": call_id}) == {
        "cancelled": True}
    result = await answerer.wait(sid, call_id)
    assert result["errorCode"] == "APPROVAL_CANCELLED" and result["isError"] is True
    await answerer.wait_lane(lane, lambda l: l.recent(call_id), "the call in recent")
    assert lane.approval_for(call_id) is None and lane.tool(call_id) is None
    # The request is decided (cancelled): a late answer is told so, and nothing ran.
    late = await answerer.error("approval.decide", {
        "sessionId": sid, "approvalId": approval_id, "decision": "allow"})
    assert late.code == -32011 and late.data == {"outcome": "cancelled"}
    assert not marker.exists()


async def test_cancel_during_the_barrier(daemon, daemon_clock, nursery, fsync_gate):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    marker = daemon.workdir / "ran"
    fsync_gate.hold(sid)  # the disk is slow: the call's checkpoint barrier waits in fsync
    call_id = await wire.run(sid, f"touch {marker}")
    await fsync_gate.wait_held()
    assert await wire.call("tool.cancel", {"sessionId": sid, "callId": call_id}) == {
        "cancelled": True}
    # Not settled while nothing is durable: a poll says "still running", never a result.
    poll = await wire.error("tool.wait", {"sessionId": sid, "callId": call_id, "timeout": 0})
    assert poll.code == -32010
    fsync_gate.release()
    result = await wire.wait(sid, call_id)
    assert result["errorCode"] == "ABORTED_BEFORE_DISPATCH", result
    assert result.get("exitCode") is None and not marker.exists()
    # The session goes on.
    again = await wire.run(sid, "echo after")
    assert (await wire.wait(sid, again))["content"] == "after\n"


async def test_a_failed_barrier_never_runs_the_command(daemon, daemon_clock, nursery,
                                                       fsync_gate):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    marker = daemon.workdir / "ran"
    fsync_gate.fail(sid)
    call_id = await wire.run(sid, f"touch {marker}")
    response = await wire.request("tool.wait", {"sessionId": sid, "callId": call_id})
    fsync_gate.release()
    if "error" in response:  # the result itself could not be made durable while failing
        assert response["error"]["code"] == -32014
        response = await wire.request("tool.wait", {"sessionId": sid, "callId": call_id})
    assert response["result"]["errorCode"] == "STORAGE_FAILURE", response
    assert not marker.exists() and fsync_gate.failed > 0


async def test_cancel_during_exec_keeps_the_output(daemon, daemon_clock, nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    lane = await wire.subscribe(sid)
    call_id = await wire.run(sid, "echo started; sleep 1000; echo never")
    await wire.wait_lane(lane, lambda l: "started" in output(l, call_id), "the output")
    assert lane.tool(call_id)["state"] == "running"
    assert await wire.call("tool.cancel", {"sessionId": sid, "callId": call_id}) == {
        "cancelled": True}
    result = await wire.wait(sid, call_id)
    assert result["errorCode"] == "TOOL_CANCELLED" and result["content"] == "started\n"
    assert "did not exit" not in result.get("message", "")
    await wire.wait_lane(lane, lambda l: l.recent(call_id), "the call in recent")
    assert lane.recent(call_id)["errorCode"] == "TOOL_CANCELLED"
    # Cancelling a settled call is no cancellation.
    assert await wire.call("tool.cancel", {"sessionId": sid, "callId": call_id}) == {
        "cancelled": False}


REFUSING_SCRIPT = [
    {"text": "Let me try.", "toolCalls": [
        {"name": "nope", "arguments": {}},
        {"name": "bash", "arguments": "{not json"},
    ]},
    {"text": "Done."},
]


@pytest.mark.parametrize("model_script", [REFUSING_SCRIPT])
async def test_a_refused_model_call_is_waitable_at_once(daemon, daemon_clock, nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    lane = await wire.subscribe(sid)
    await wire.call("turn.start", {"sessionId": sid, "input": "go"})
    await wire.wait_lane(lane, lambda l: len(l.value["recent"]) >= 2, "two refused calls")
    refused = {entry["callId"]: entry for entry in lane.value["recent"]}
    assert sorted(e["errorCode"] for e in refused.values()) == ["INVALID_ARGUMENTS",
                                                              "UNKNOWN_TOOL"]
    for call_id, entry in refused.items():
        result = await wire.wait(sid, call_id)  # not -32006: known at once
        assert result["errorCode"] == entry["errorCode"] and result["isError"] is True


LIMIT_SCRIPT = [
    {"text": "Two at once.", "toolCalls": [
        {"name": "bash", "arguments": {"command": "echo started; sleep 1000"}},
        {"name": "bash", "arguments": {"command": "echo second"}},
    ]},
    {"text": "Done."},
]


@pytest.mark.parametrize("model_script", [LIMIT_SCRIPT])
@pytest.mark.parametrize("daemon_overrides", [{"max_calls": 1}])
async def test_a_model_call_refused_by_turn_cancel_is_waitable(
        daemon, daemon_clock, nursery):
    """bash is not ``concurrent``: the step runs its calls one at a time. The first model call
    holds the daemon's one call slot (``max_calls`` = 1); turn.cancel then refuses the second
    before it starts (``ABORTED_BEFORE_DISPATCH``, through the refusal path)."""
    wire = await daemon.connect(approvals=True, nursery=nursery)
    sid = await daemon.create_session(wire)
    lane = await wire.subscribe(sid)
    await wire.call("turn.start", {"sessionId": sid, "input": "go"})
    approval_id, asked = await wire.wait_lane(
        lane, lambda l: next(iter(l.value["approvals"].items()), None), "the model call's gate")
    first = asked["callId"]
    assert await wire.call("approval.decide", {"sessionId": sid, "approvalId": approval_id,
                                               "decision": "allow"}) == {
        "outcome": "allowed-once"}
    await wire.wait_lane(lane, lambda l: "started" in output(l, first), "the first call running")
    # A frontend call past max_calls is refused with nothing recorded.
    busy = await wire.error("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                         "arguments": {"command": "true"}})
    assert busy.code == -32013 and busy.data == {"code": "CALL_LIMIT"}
    assert await wire.call("turn.cancel", {"sessionId": sid}) == {"cancelled": True}
    await wire.wait_lane(lane, lambda l: len(l.value["recent"]) >= 2, "both calls settled")
    codes = {e["callId"]: e["errorCode"] for e in lane.value["recent"]}
    assert codes.pop(first) == "TOOL_CANCELLED"
    [(second, code)] = codes.items()
    assert code == "ABORTED_BEFORE_DISPATCH"
    result = await wire.wait(sid, second)
    assert result["errorCode"] == "ABORTED_BEFORE_DISPATCH" and "second" not in result["content"]
