"""A model call the turn loop refuses is waitable at once (issue 11).

The turn loop records the model's answer (``message/assistant`` with every proposed callId)
and then works through the calls in groups. A proposed call it refuses (unknown tool, invalid
arguments) must be settled the moment the answer is recorded: a client that reads the callId
from the log and asks ``tool.wait`` gets the result, never ``-32006`` while an earlier call of
the same step still waits for its approval."""

from __future__ import annotations

import trio

from client.api import connect
from tests.agent.fake_model_server import text_reply, tool_reply
from tests.agent.helpers import WAIT_S, events_of, sandbox_mode, wait_turn_end


async def _proposed_ids(c, sid: str) -> list[str]:
    with trio.fail_after(WAIT_S):
        while True:
            for e in await events_of(c, sid):
                if e["type"] == "message/assistant" and e["data"].get("toolCalls"):
                    return [t["callId"] for t in e["data"]["toolCalls"]]
            await trio.sleep(0.02)


async def test_a_refused_model_call_is_waitable_while_an_earlier_call_waits(
        dshd, fake_model, workdir):
    fake_model.script(
        tool_reply([("bash", {"command": "true"}), ("python", {"code": "1"}),
                    ("bash", {"cmd": "ls"})]),
        text_reply("done"),
    )
    async with connect(dshd.config.socket, approvals=True) as c:
        sid = await c.create_session(str(workdir), sandbox=sandbox_mode(dshd))
        sub = await c.subscribe(sid)  # an answerer that does not decide: call 1 waits
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "go"}))["turnId"]
        first, unknown, invalid = await _proposed_ids(c, sid)
        with trio.fail_after(5):
            r_unknown = await c.call("tool.wait", {"sessionId": sid, "callId": unknown,
                                                   "timeout": 5})
            r_invalid = await c.call("tool.wait", {"sessionId": sid, "callId": invalid,
                                                   "timeout": 5})
        assert r_unknown["errorCode"] == "UNKNOWN_TOOL"
        assert r_invalid["errorCode"] == "INVALID_ARGUMENTS"
        # the first call is still waiting for its approval; reject it to end the turn
        with trio.fail_after(WAIT_S):
            view = await sub.next_view()
            while not view["approvals"]:
                view = await sub.next_view()
        (aid,) = view["approvals"]
        await c.call("approval.decide", {"sessionId": sid, "approvalId": aid,
                                         "decision": "reject"})
        end = await wait_turn_end(c, sid, turn_id)
        r_first = await c.call("tool.wait", {"sessionId": sid, "callId": first, "timeout": 5})
    assert end["data"]["reason"] == "completed"
    assert r_first["errorCode"] == "APPROVAL_REJECTED"
