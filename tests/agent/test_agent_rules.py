"""A model's call is decided by an approval rule like a client's (PROTOCOL.md §3.4): the
person answers the first proposed call ``allow-for-session`` with a prefix rule; the model's
next call that the rule allows runs without asking, with its audit pair ``by: rule``; one
that only looks like it (an operator after the prefix) is asked."""

from __future__ import annotations

import trio

from client.api import connect
from tests.agent.fake_model_server import text_reply, tool_reply
from tests.agent.helpers import WAIT_S, events_of, sandbox_mode, wait_turn_end


async def _next_request(sub) -> str:
    with trio.fail_after(WAIT_S):
        while True:
            view = await sub.next_view()
            if view["approvals"]:
                (aid,) = view["approvals"]
                return aid


async def test_a_rule_decides_the_models_next_call_by_rule(dshd, fake_model, workdir):
    fake_model.script(
        tool_reply([("bash", {"command": "echo model one"})]),
        tool_reply([("bash", {"command": "echo model two"})]),
        tool_reply([("bash", {"command": "echo model three; echo sneaky"})]),
        text_reply("done"),
    )
    async with connect(dshd.config.socket, approvals=True) as c:
        sid = await c.create_session(str(workdir), sandbox=sandbox_mode(dshd))
        sub = await c.subscribe(sid)
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "go"}))["turnId"]
        aid = await _next_request(sub)
        result = await c.decide_full(sid, aid, "allow-for-session", ("prefix", "echo model"))
        assert result.outcome == "allowed-once"
        rule_id = result.rule_id
        third = await _next_request(sub)  # the second call never asked; the third does
        await c.decide(sid, third, "reject")
        end = await wait_turn_end(c, sid, turn_id)
        events = await events_of(c, sid)
    assert end["data"]["reason"] == "completed"
    asked = {e["data"]["approvalId"]: e["data"]["summary"] for e in events
             if e["type"] == "approval/asked"}
    decided = {e["data"]["approvalId"]: e["data"] for e in events
               if e["type"] == "approval/decided"}
    by_summary = {asked[a]: (d["outcome"], d["by"], d.get("ruleId")) for a, d in decided.items()}
    assert by_summary == {
        "echo model one": ("allowed-once", "answerer", rule_id),
        "echo model two": ("allowed-once", "rule", rule_id),
        "echo model three; echo sneaky": ("rejected", "answerer", None),
    }
