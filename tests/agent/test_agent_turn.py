"""Turns against an in-process dshd whose model is the FAKE server on 127.0.0.1 (issue 5).

Each test drives the daemon only through the client protocol and checks the session log,
the lane view and the requests the fake server received."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
import trio

from client.api import connect
from protocol.rpc import RpcError
from tests.agent.fake_model_server import error_reply, text_reply, tool_reply
from tests.agent.helpers import (
    WAIT_S,
    approve_all,
    events_of,
    sandbox_mode,
    turn_events,
    wait_turn_end,
    wait_until,
)


async def _session(c, daemon, workdir, **kw) -> str:
    return await c.create_session(str(workdir), sandbox=sandbox_mode(daemon), **kw)


@pytest.fixture
def outside_dir():
    """A directory of ours outside the workspace and outside /tmp (which is private in the
    sandbox): a confined tool cannot write there."""
    d = Path(tempfile.mkdtemp(prefix="dsh-ag-outside-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_a_turn_runs_a_model_call_through_the_pipeline(dshd, fake_model, workdir, outside_dir):
    """429 then a tool call split across chunks; the call is approved and runs confined; a 500,
    a stream cut mid-way, then the final answer, streamed into the lane (``a`` ops); every
    request after the call carries its result."""
    outside = outside_dir / "outside.txt"
    command = (f"echo made > inside.txt && cat inside.txt && "
               f"(echo x > {outside} 2>/dev/null && echo ESCAPED || echo CONFINED)")
    release = threading.Event()
    final = text_reply("All done: the file says made.", pieces=4, hold_before=3, hold=release)
    before_hold = "".join(e["choices"][0]["delta"].get("content") or "" for e in final.events[:3])
    cut = text_reply("This answer breaks off", pieces=4)
    cut.cut_after = 3  # the connection drops mid-stream
    fake_model.script(
        error_reply(429, "rate limited", headers={"Retry-After": "0"}),
        tool_reply([("bash", {"command": command})], text="Let me check.", split=4),
        error_reply(500, "flaky"),
        cut,
        final,
    )
    decisions: list = []
    async with connect(dshd.config.socket, "answerer", approvals=True) as ans, \
            connect(dshd.config.socket) as c, trio.open_nursery() as nursery:
        sid = await _session(c, dshd, workdir)
        await nursery.start(approve_all, ans, sid, decisions)
        watch = await c.subscribe(sid)
        await watch.next_view()
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "make a file"}))["turnId"]

        # The lane shows the turn, then the final answer growing with `a` ops; the fake
        # server holds the rest of the stream until we have seen that.
        appends: list[str] = []
        with trio.fail_after(WAIT_S):
            while True:
                view = await watch.next_view()
                for op in watch.mirror.last_ops:
                    if op[0] == "a" and list(op[1]) == ["turn", "text"]:
                        appends.append(op[2])
                turn = view["turn"]
                if turn and turn["step"] == 2 and turn["text"] == before_hold:
                    break
        assert turn["turnId"] == turn_id and turn["state"] == "running"
        release.set()
        end = await wait_turn_end(c, sid, turn_id)
        with trio.fail_after(WAIT_S):
            while watch.mirror.value["turn"] is not None:
                await watch.next_view()
        events = await events_of(c, sid)
        nursery.cancel_scope.cancel()

    assert end["data"] == {"turnId": turn_id, "reason": "completed"}
    evs = turn_events(events, turn_id)
    assert [e["type"] for e in evs] == [
        "turn/start", "message/user", "step/start", "message/assistant", "tool/call",
        "approval/asked", "approval/decided", "tool/result", "step/end",
        "step/start", "message/assistant", "step/end", "turn/end",
    ]
    first = evs[3]["data"]
    assert first["text"] == "Let me check." and first["usage"]["total_tokens"] == 18
    assert first["attempts"] == 2  # the 429 was retried
    (tc,) = first["toolCalls"]
    assert tc["name"] == "bash" and json.loads(tc["arguments"]) == {"command": command}
    call = evs[4]["data"]
    assert call["callId"] == tc["callId"] and call["turnId"] == turn_id and call["stepId"] == "s1"
    assert evs[6]["data"]["outcome"] == "allowed-once" and evs[6]["data"]["by"] == "answerer"
    assert decisions == [(tc["callId"], command, "allowed-once")]
    result = evs[7]["data"]
    assert result["exitCode"] == 0 and result["content"].startswith("made\n")
    assert (workdir / "inside.txt").read_text() == "made\n"
    if sandbox_mode(dshd) == "workspace-write":  # confined: a write outside cwd is refused
        assert "CONFINED" in result["content"] and not outside.exists()
    assert evs[10]["data"]["text"] == "All done: the file says made."
    assert evs[10]["data"]["attempts"] == 3  # 500, cut stream, success
    assert "".join(appends).endswith(before_hold)  # the text grew by appends

    # Requests: 429, the tool call, then 500, cut, the answer: those three carry the result.
    bodies = fake_model.bodies()
    assert len(bodies) == 5
    assert bodies[0] == bodies[1]
    assert [m["role"] for m in bodies[1]["messages"]] == ["system", "user"]
    second = bodies[4]["messages"]
    assert bodies[2] == bodies[3] == bodies[4]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[2]["tool_calls"][0]["id"] == tc["callId"]
    assert second[2]["tool_calls"][0]["function"] == {"name": "bash", "arguments": tc["arguments"]}
    assert second[3]["tool_call_id"] == tc["callId"]
    assert second[3]["content"].startswith("made\n") and "exit code: 0" in second[3]["content"]


async def test_cancel_during_a_step(dshd, fake_model, workdir):
    """The running call gets TOOL_CANCELLED, the one queued behind it ABORTED_BEFORE_DISPATCH
    (no tool/call, it never ran), the turn ends cancelled, and no second request is sent."""
    fake_model.script(tool_reply([
        ("bash", {"command": "echo started > started.txt; sleep 600"}),
        ("bash", {"command": "echo second > second.txt"}),
    ]))
    async with connect(dshd.config.socket, "answerer", approvals=True) as ans, \
            connect(dshd.config.socket) as c, trio.open_nursery() as nursery:
        sid = await _session(c, dshd, workdir)
        await nursery.start(approve_all, ans, sid)
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "go"}))["turnId"]
        await wait_until(lambda: (workdir / "started.txt").exists())
        r = await c.call("turn.cancel", {"sessionId": sid})
        assert r == {"cancelled": True}
        end = await wait_turn_end(c, sid, turn_id)
        events = await events_of(c, sid)
        again = await c.call("turn.cancel", {"sessionId": sid})
        nursery.cancel_scope.cancel()
    assert again == {"cancelled": False}
    assert end["data"]["reason"] == "cancelled"
    evs = turn_events(events, turn_id)
    first, second = (c["callId"] for c in next(
        e for e in evs if e["type"] == "message/assistant")["data"]["toolCalls"])
    results = {e["data"]["callId"]: e["data"] for e in evs if e["type"] == "tool/result"}
    assert results[first]["errorCode"] == "TOOL_CANCELLED"
    assert results[second]["errorCode"] == "ABORTED_BEFORE_DISPATCH"
    assert second not in {e["data"]["callId"] for e in evs if e["type"] == "tool/call"}
    assert not (workdir / "second.txt").exists()
    assert [e["type"] for e in evs][-2:] == ["step/end", "turn/end"]
    assert len(fake_model.requests) == 1


async def test_cancel_while_the_model_streams_keeps_the_partial_text(dshd, fake_model, workdir):
    release = threading.Event()
    reply = text_reply("one two three four", pieces=4, hold_before=3, hold=release)
    before_hold = "".join(e["choices"][0]["delta"].get("content") or "" for e in reply.events[:3])
    fake_model.script(reply)
    async with connect(dshd.config.socket) as c:
        sid = await _session(c, dshd, workdir)
        sub = await c.subscribe(sid)
        await sub.next_view()
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "count"}))["turnId"]
        with trio.fail_after(WAIT_S):
            while True:
                view = await sub.next_view()
                if view["turn"] and view["turn"]["text"] == before_hold:
                    break
        await c.call("turn.cancel", {"sessionId": sid})
        end = await wait_turn_end(c, sid, turn_id)
        events = await events_of(c, sid)
    release.set()
    assert end["data"]["reason"] == "cancelled"
    (answer,) = [e["data"] for e in events if e["type"] == "message/assistant"]
    assert answer["partial"] is True and answer["text"] == before_hold == "one two th"


async def test_one_turn_at_a_time_and_steering(dshd, fake_model, workdir):
    """A second turn.start is refused while one runs; a steer becomes a message/user at the
    next step boundary and is in the next request."""
    fake_model.script(
        tool_reply([("bash", {"command": "while [ ! -e go ]; do sleep 0.05; done; echo went"})]),
        text_reply("ok, noted"),
    )
    async with connect(dshd.config.socket, "answerer", approvals=True) as ans, \
            connect(dshd.config.socket) as c, trio.open_nursery() as nursery:
        sid = await _session(c, dshd, workdir)
        await nursery.start(approve_all, ans, sid)
        with pytest.raises(RpcError) as none:
            await c.call("turn.steer", {"sessionId": sid, "input": "early"})
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "wait for go"}))["turnId"]
        with pytest.raises(RpcError) as busy:
            await c.call("turn.start", {"sessionId": sid, "input": "another"})
        r = await c.call("turn.steer", {"sessionId": sid, "input": "also say noted"})
        assert r == {"turnId": turn_id, "queued": True}
        (workdir / "go").touch()
        end = await wait_turn_end(c, sid, turn_id)
        events = await events_of(c, sid)
        nursery.cancel_scope.cancel()
    assert none.value.code == -32602 and none.value.data["code"] == "NO_TURN"
    assert busy.value.code == -32013 and busy.value.data == {"code": "TURN_RUNNING", "turnId": turn_id}
    assert end["data"]["reason"] == "completed"
    steer = [e for e in turn_events(events, turn_id) if e["type"] == "message/user"][1]
    assert steer["data"] == {"turnId": turn_id, "text": "also say noted", "steer": True}
    types = [e["type"] for e in turn_events(events, turn_id)]
    assert types.index("message/user", 2) < types.index("step/start", types.index("step/end"))
    last = fake_model.bodies()[1]["messages"]
    assert [m["role"] for m in last][-3:] == ["assistant", "tool", "user"]
    assert last[-1]["content"] == "also say noted"


@pytest.mark.parametrize("model_overrides", [{"max_steps": 2}])
async def test_the_step_limit_ends_the_turn_with_an_error(dshd, fake_model, workdir):
    fake_model.script(*[tool_reply([("bash", {"command": "true"})])] * 2)
    async with connect(dshd.config.socket, "answerer", approvals=True) as ans, \
            connect(dshd.config.socket) as c, trio.open_nursery() as nursery:
        sid = await _session(c, dshd, workdir)
        await nursery.start(approve_all, ans, sid)
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "loop"}))["turnId"]
        end = await wait_turn_end(c, sid, turn_id)
        nursery.cancel_scope.cancel()
    assert end["data"]["reason"] == "error" and end["data"]["errorCode"] == "STEP_LIMIT"
    assert len(fake_model.requests) == 2


async def test_unapproved_invalid_and_unknown_calls_get_results_the_model_reads(
        dshd, fake_model, workdir):
    """No answerer and ``askTimeout: 0`` (no grace): APPROVAL_UNAVAILABLE (model calls are
    never pre-approved); bad arguments and unknown tools settle without a tool/call. The next
    request has a result for each."""
    fake_model.script(
        tool_reply([("bash", {"command": "touch never.txt"}), ("bash", {"cmd": "ls"}),
                    ("python", {"code": "1"}), ("bash", "{not json")]),
        text_reply("I could not run anything."),
    )
    async with connect(dshd.config.socket) as c:
        sid = await _session(c, dshd, workdir)
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "try",
                                               "askTimeout": 0}))["turnId"]
        end = await wait_turn_end(c, sid, turn_id)
        events = await events_of(c, sid)
    assert end["data"]["reason"] == "completed"
    assert not (workdir / "never.txt").exists()
    tool_msgs = [m for m in fake_model.bodies()[1]["messages"] if m["role"] == "tool"]
    codes = ["APPROVAL_UNAVAILABLE", "INVALID_ARGUMENTS", "UNKNOWN_TOOL", "INVALID_ARGUMENTS"]
    assert [f"errorCode: {code}" in m["content"] for m, code in zip(tool_msgs, codes)] == [True] * 4
    assert len({e["data"]["callId"] for e in events if e["type"] == "tool/call"}) == 1


async def test_model_failure_ends_the_turn_with_an_error(dshd, fake_model, workdir):
    fake_model.script(*[error_reply(503, "overloaded")] * 3)
    async with connect(dshd.config.socket) as c:
        sid = await _session(c, dshd, workdir)
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "hi"}))["turnId"]
        end = await wait_turn_end(c, sid, turn_id)
        events = await events_of(c, sid)
        # The session takes a new turn afterwards.
        fake_model.script(text_reply("back"))
        t2 = (await c.call("turn.start", {"sessionId": sid, "input": "again"}))["turnId"]
        end2 = await wait_turn_end(c, sid, t2)
    assert end["data"]["reason"] == "error" and end["data"]["errorCode"] == "MODEL_UNAVAILABLE"
    assert "503" in end["data"]["message"]
    assert [e["type"] for e in turn_events(events, turn_id)] == [
        "turn/start", "message/user", "step/start", "step/end", "turn/end"]
    assert end2["data"]["reason"] == "completed"
    # The failed turn's input is history too.
    assert [m["content"] for m in fake_model.bodies()[-1]["messages"][1:]] == ["hi", "again", ]


@pytest.mark.parametrize("config_overrides", [{"session_idle_seconds": 0.1}])
async def test_a_running_turn_keeps_its_session_open(dshd, fake_model, workdir):
    """No subscriber, no call, a slow model: the idle closer must not end the turn."""
    release = threading.Event()
    fake_model.script(text_reply("slow answer", hold_before=2, hold=release))
    async with connect(dshd.config.socket) as c:
        sid = await _session(c, dshd, workdir)
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "hi"}))["turnId"]
        await wait_until(lambda: len(fake_model.requests) == 1)
        await trio.sleep(0.5)  # several idle periods pass while the model "thinks"
        release.set()
        end = await wait_turn_end(c, sid, turn_id)
    assert end["data"]["reason"] == "completed"


async def test_calls_of_a_concurrent_tool_run_side_by_side(dshd, fake_model, workdir, monkeypatch):
    """Each call waits for a file the other one writes: only concurrent execution finishes
    (bash is not concurrent by default; the flag is flipped here to exercise that path)."""
    import dataclasses

    from dshd.agent import tools

    monkeypatch.setitem(tools.TOOLS, "bash", dataclasses.replace(tools.BASH, concurrent=True))
    wait_for = "touch {mine}; while [ ! -e {other} ]; do sleep 0.02; done; echo met"
    fake_model.script(
        tool_reply([("bash", {"command": wait_for.format(mine="a", other="b"), "timeout": 20}),
                    ("bash", {"command": wait_for.format(mine="b", other="a"), "timeout": 20})]),
        text_reply("both met"),
    )
    async with connect(dshd.config.socket, "answerer", approvals=True) as ans, \
            connect(dshd.config.socket) as c, trio.open_nursery() as nursery:
        sid = await _session(c, dshd, workdir)
        await nursery.start(approve_all, ans, sid)
        turn_id = (await c.call("turn.start", {"sessionId": sid, "input": "meet"}))["turnId"]
        end = await wait_turn_end(c, sid, turn_id)
        events = await events_of(c, sid)
        nursery.cancel_scope.cancel()
    assert end["data"]["reason"] == "completed"
    results = [e["data"] for e in turn_events(events, turn_id) if e["type"] == "tool/result"]
    assert [r["exitCode"] for r in results] == [0, 0]
    assert all(r["content"] == "met\n" for r in results)
