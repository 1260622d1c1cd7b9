"""The lane's ``turn`` value carries the step's calls with their states (issue 15, PROTOCOL.md
§3.3/§3.5): against an in-process dshd whose model is the FAKE server, watched through a real
subscription batch by batch."""

from __future__ import annotations

import trio

from client.api import connect
from tests.agent.fake_model_server import text_reply, tool_reply
from tests.agent.helpers import WAIT_S, sandbox_mode, wait_turn_end

STATES = ["proposed", "waiting-approval", "running", "settled"]


def _ordered(seen: list[str]) -> bool:
    """``seen`` (consecutive duplicates dropped) is a subsequence of STATES in order."""
    ranks = [STATES.index(s) for s in seen]
    return ranks == sorted(set(ranks))


async def test_turn_calls_carry_each_calls_state(dshd, fake_model, workdir):
    """A step names three calls: two bash calls (run one at a time) and an unknown tool. The
    lane's ``turn.calls`` lists them in order with names; the unknown one is ``settled`` with
    its errorCode at once, the second bash call is ``proposed`` while the first waits for its
    approval and runs, each goes waiting-approval → running → settled with its exit code."""
    gate = workdir / "go"
    first = f"while [ ! -f {gate} ]; do sleep 0.05; done; echo one"
    fake_model.script(
        tool_reply([("bash", {"command": first}), ("bash", {"command": "exit 3"}),
                    ("teleport", {"where": "mars"})], text="Two calls."),
        text_reply("Done."),
    )
    seen: dict[str, list[str]] = {}
    async with connect(dshd.config.socket, "answerer", approvals=True) as c:
        sid = await c.create_session(str(workdir), sandbox=sandbox_mode(dshd))
        sub = await c.subscribe(sid)
        await sub.next_view()
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "go"}))["turnId"]
        calls: list[dict] = []
        decided: set[str] = set()
        with trio.fail_after(WAIT_S):
            while True:
                view = await sub.next_view()
                turn = view["turn"]
                if turn is None or turn["step"] != 1:
                    if calls:
                        break
                    continue
                if turn["calls"]:
                    calls = [dict(c) for c in turn["calls"]]  # the mirror edits in place
                for call in turn["calls"]:
                    states = seen.setdefault(call["callId"], [])
                    if not states or states[-1] != call["state"]:
                        states.append(call["state"])
                first_id = calls[0]["callId"] if calls else None
                if first_id and seen[first_id][-1] == "running" and not gate.exists():
                    assert seen[calls[1]["callId"]][-1] == "proposed"
                    gate.write_text("")
                for aid, req in view["approvals"].items():
                    if aid not in decided:
                        decided.add(aid)
                        await c.decide(sid, aid, "allow")
        await wait_turn_end(c, sid, turn_id)
        await sub.aclose()
    one, two, unknown = calls
    assert [(c["name"]) for c in calls] == ["bash", "bash", "teleport"]
    assert seen[unknown["callId"]] == ["settled"]
    assert unknown["errorCode"] == "UNKNOWN_TOOL" and unknown["exitCode"] is None
    for call in (one, two):
        states = seen[call["callId"]]
        assert _ordered(states), states
        assert "waiting-approval" in states and states[-1] == "settled"
    assert "running" in seen[one["callId"]]
    assert one["exitCode"] == 0 and one["errorCode"] is None
    assert two["exitCode"] == 3
    assert seen[two["callId"]][0] == "proposed"
