"""The wire through a real Connection and dispatch (PROTOCOL.md §1–§2): batches, answer
objects sent to the daemon, half-close and close. DaemonPair harness: ``conftest.py``."""

from __future__ import annotations

import json

import trio
import trio.testing

from .conftest import Wire

RESPONSE = {"jsonrpc": "2.0", "id": 77, "result": {"ok": True}}
ERROR_RESPONSE = {"jsonrpc": "2.0", "id": 78, "error": {"code": -1, "message": "no"}}


def _stream_index(wire: Wire, subscription_id: str) -> int:
    for i, message in enumerate(wire.received):
        if (isinstance(message, dict) and message.get("method") == "stream"
                and message["params"]["subscriptionId"] == subscription_id):
            return i
    raise AssertionError(f"no stream notification for {subscription_id}")


async def test_batch_with_subscribe_answers_before_the_base_batch(daemon, daemon_clock, nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    sub_req = wire.request_object("subscribe", {"sessionId": sid})
    get_req = wire.request_object("session.get", {"sessionId": sid})
    note = {"jsonrpc": "2.0", "method": "daemon.status"}  # a notification: no answer
    await wire.send([sub_req, note, get_req])

    def batch_answer():
        for i, message in enumerate(wire.received):
            if isinstance(message, list):
                return i, message
        return None

    index, answers = await wire.wait_for(batch_answer, "the batch's array")
    # One array, one answer per request (none for the notification), in any order.
    assert sorted(a["id"] for a in answers) == sorted([sub_req["id"], get_req["id"]])
    by_id = {a["id"]: a for a in answers}
    sub_id = by_id[sub_req["id"]]["result"]["subscriptionId"]
    assert by_id[get_req["id"]]["result"]["sessionId"] == sid
    lane = await wire.wait_for(lambda: wire.lanes.get(sub_id), "the base batch")
    first = _stream_index(wire, sub_id)
    assert index < first, "the subscription's base batch came before the batch's answers"
    base = wire.received[first]["params"]
    assert base["seq"] == 0 and base["ops"][0][0] == "r"
    assert lane.value["session"]["sessionId"] == sid and lane.value["tools"] == {}
    # The lane follows: a call shows up as deltas after the base.
    call_id = await wire.run(sid, "echo lane")
    await wire.wait_lane(lane, lambda l: l.recent(call_id), "the call in recent")
    assert lane.seq >= 1 and lane.recent(call_id)["exitCode"] == 0


async def test_answer_objects_sent_to_the_daemon_are_invalid_requests(daemon, daemon_clock,
                                                                       nursery):
    wire = await daemon.connect(nursery=nursery)
    for answer in (RESPONSE, ERROR_RESPONSE):
        before = len(wire.received)
        await wire.send(answer)
        reply = await wire.wait_for(
            lambda: len(wire.received) > before and wire.received[before], "a reply")
        assert reply["id"] is None and reply["error"]["code"] == -32600, reply
        assert "response" in reply["error"]["message"]
    # In a batch: the answer object gets its -32600, the request beside it runs.
    status = wire.request_object("daemon.status")
    await wire.send([RESPONSE, status])
    answers = await wire.wait_for(
        lambda: next((m for m in wire.received if isinstance(m, list)), None), "the array")
    assert len(answers) == 2
    assert any(a["id"] is None and a["error"]["code"] == -32600 for a in answers)
    assert any(a["id"] == status["id"] and "pid" in a["result"] for a in answers)
    # The connection stays: the next request is served.
    assert (await wire.call("daemon.status"))["connections"] == 1


async def test_half_close_still_delivers_every_answer(daemon, daemon_clock, nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    await wire.run(sid, "read -t 1 x; echo before-eof", call_id="hc1")
    wait = wire.request_object("tool.wait", {"sessionId": sid, "callId": "hc1"})
    get = wire.request_object("session.get", {"sessionId": sid})
    await wire.send_raw((json.dumps(wait) + "\n" + json.dumps(get) + "\n").encode())
    await wire.half_close()  # shutdown(SHUT_WR): no more requests, answers still wanted
    await wire.wait_for(lambda: wire.eof.is_set(), "the daemon to close after answering")
    assert wire.answer(get["id"])["result"]["sessionId"] == sid
    result = wire.answer(wait["id"])["result"]
    assert result["content"] == "before-eof\n" and result["isError"] is False


async def test_closing_both_halves_cancels_requests_not_calls(daemon, daemon_clock, nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    watcher = await daemon.connect(nursery=nursery)
    lane = await watcher.subscribe(sid)
    await wire.run(sid, "echo started; sleep 1000", call_id="gone1")
    await watcher.wait_lane(lane, lambda l: "started" in _output(l, "gone1"), "the command")
    await wire.send(wire.request_object("tool.wait", {"sessionId": sid, "callId": "gone1"}))
    await wire.aclose()  # the peer is gone: its tool.wait is not answered, the call goes on
    await trio.testing.wait_all_tasks_blocked()  # the daemon has seen the close
    assert (await watcher.call("daemon.status"))["connections"] == 1
    assert (await watcher.call("session.get", {"sessionId": sid}))["running"] == 1
    assert await watcher.call("tool.cancel", {"sessionId": sid, "callId": "gone1"}) == {
        "cancelled": True}
    result = await watcher.wait(sid, "gone1")
    assert result["errorCode"] == "TOOL_CANCELLED" and result["content"] == "started\n"


def _output(lane, call_id: str) -> str:
    tool = lane.tool(call_id)
    return tool["output"]["content"][0]["text"] if tool else ""


async def test_a_connection_holds_a_bounded_number_of_subscriptions(daemon, daemon_clock,
                                                                      nursery, monkeypatch):
    """PROTOCOL.md §5: past the per-connection bound a subscribe is -32013 and nothing is
    attached; the connection and its other subscriptions go on."""
    from dshd.handlers import streams
    monkeypatch.setattr(streams, "MAX_SUBSCRIPTIONS_PER_CONNECTION", 3)
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    ids = [(await wire.call("subscribe", {"sessionId": sid}))["subscriptionId"]
           for _ in range(3)]
    refused = await wire.error("subscribe", {"sessionId": sid})
    assert refused.code == -32013 and "at most 3" in refused.message
    status = await wire.call("daemon.status")
    assert status["subscriptions"] == 3
    await wire.call("unsubscribe", {"subscriptionId": ids[0]})
    assert "subscriptionId" in await wire.call("subscribe", {"sessionId": sid})
