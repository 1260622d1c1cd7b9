"""The turn loop driven through a fake ``SessionPort`` (no daemon, no log, autojump clock).

``dshd.agent.turn`` talks to its session only through ``dshd.agent.port.SessionPort``; these
tests give it a fake that records what the loop asks for, and a scripted model, so the loop's
own decisions are checked directly: what it records, which calls it starts or settles
unstarted, what it shows on the lane's ``turn``, and that a refused call is settled before the
step's first call has finished."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from dshd import errors
from dshd.agent import TurnDriver
from dshd.config import Config, ModelConfig


@dataclass
class Ev:
    seq: int
    type: str
    data: dict


class FakeLane:
    def __init__(self) -> None:
        self.turn: dict | None = None
        self.history: list[tuple] = []

    def begin_turn(self, view) -> None:
        self.turn = {"turnId": view.turn_id, "state": view.state, "text": view.text}
        self.history.append(("begin", view.state))

    def set_turn(self, view) -> None:
        self.turn = None if view is None else {"turnId": view.turn_id, "state": view.state,
                                               "text": view.text}
        self.history.append(("set", None if view is None else view.state))

    def update_turn(self, key, value) -> None:
        if self.turn is not None:
            self.turn[key] = value
            self.history.append((key, value))

    def turn_calls(self, calls) -> None:
        if self.turn is not None:
            self.turn["calls"] = [c.call_id for c in calls]
            self.history.append(("calls", self.turn["calls"]))

    def turn_text(self, text, *, append=False) -> None:
        if self.turn is not None:
            self.turn["text"] = self.turn["text"] + text if append else text


class FakePort:
    """A session as the agent loop sees it; calls settle when the test says so."""

    def __init__(self, nursery: trio.Nursery, script, *, limit: int = 100) -> None:
        self.id = "fake-session"
        self.config = Config(model=ModelConfig(provider="scripted", script=str(script),
                                               max_steps=4))
        self.agent = None
        self.cwd = "/nonexistent"
        self.turn_lane = FakeLane()
        self.log: list[Ev] = []
        self.nursery = nursery
        self.started: dict[str, dict] = {}
        self.proposed: set[str] = set()
        self.settled: dict[str, dict] = {}
        self.events: dict[str, trio.Event] = {}
        self.cancelled: list[str] = []
        self.limit = limit
        self.open = True

    @property
    def last_seq(self) -> int:
        return len(self.log) - 1

    def record(self, type_: str, data: dict) -> int:
        self.log.append(Ev(len(self.log), type_, data))
        return len(self.log) - 1

    async def wait_durable(self, seq: int) -> None:
        await trio.lowlevel.checkpoint()

    async def history(self) -> list:
        await trio.lowlevel.checkpoint()
        return list(self.log)

    def accepting(self) -> bool:
        return self.open

    def spawn(self, fn, *args) -> None:
        self.nursery.start_soon(fn, *args)

    def deadline(self) -> float:
        return math.inf

    def has_call(self, call_id: str) -> bool:
        return call_id in self.proposed or call_id in self.settled

    def propose_call(self, call_id: str, name: str) -> None:
        self.proposed.add(call_id)
        self.events.setdefault(call_id, trio.Event())

    def start_call(self, call_id, name, arguments, approved, *, turn_id=None, step_id=None,
                   ask_timeout=None):
        if len(self.started) >= self.limit:
            raise errors.CallLimit(f"session {self.id} already runs {self.limit} calls")
        assert call_id in self.proposed and not approved
        self.record("tool/call", {"callId": call_id, "name": name, "turnId": turn_id})
        self.started[call_id] = arguments

    def finish(self, call_id: str, code: str | None = None) -> None:
        result = {"callId": call_id, "isError": code is not None, "content": "ok",
                  "details": {"truncation": {}}}
        if code:
            result["errorCode"] = code
        self.record("tool/result", result)
        self.settled[call_id] = result
        self.events[call_id].set()

    def settle_unstarted(self, call_id, name, code, text) -> dict:
        assert call_id not in self.started
        self.finish(call_id, code)
        return self.settled[call_id]

    async def wait_result(self, call_id, timeout):
        await self.events[call_id].wait()
        return self.settled[call_id]

    def cancel_call(self, call_id) -> bool:
        self.cancelled.append(call_id)
        if call_id in self.settled:
            return False
        self.finish(call_id, "TOOL_CANCELLED")
        return True

    def types(self) -> list[str]:
        return [e.type for e in self.log]

    def end(self) -> dict | None:
        return next((e.data for e in self.log if e.type == "turn/end"), None)


def _script(tmp_path, *responses) -> str:
    path = tmp_path / "script.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in responses))
    return str(path)


async def _until(predicate) -> None:
    with trio.fail_after(60):
        while not predicate():
            await trio.sleep(0.01)


@pytest.mark.parametrize("autojump_clock", [trio.testing.MockClock(autojump_threshold=0)])
async def test_refused_calls_settle_before_the_first_call_of_the_step_ends(tmp_path,
                                                                           autojump_clock):
    script = _script(tmp_path, {"text": "go", "toolCalls": [
        {"name": "bash", "arguments": {"command": "true"}},
        {"name": "python", "arguments": {"code": "1"}},
        {"name": "bash", "arguments": {"cmd": "ls"}}]}, {"text": "done"})
    async with trio.open_nursery() as nursery:
        port = FakePort(nursery, script)
        driver = TurnDriver.of(port)
        assert port.agent is driver and driver.busy() is False
        driver.start("hi")
        await _until(lambda: port.started)
        (first,) = port.started
        # The two refused calls are settled while the first one still runs.
        refused = {cid: r["errorCode"] for cid, r in port.settled.items()}
        assert sorted(refused.values()) == ["INVALID_ARGUMENTS", "UNKNOWN_TOOL"]
        assert port.turn_lane.turn["state"] == "waiting-tools"
        assert len(port.turn_lane.turn["calls"]) == 3
        port.finish(first)
        await _until(lambda: port.end() is not None)
    assert port.end() == {"turnId": driver_turn_id(port), "reason": "completed"}
    assert port.turn_lane.turn is None and driver.turn is None


def driver_turn_id(port: FakePort) -> str:
    return next(e.data["turnId"] for e in port.log if e.type == "turn/start")


@pytest.mark.parametrize("autojump_clock", [trio.testing.MockClock(autojump_threshold=0)])
async def test_cancel_settles_every_proposed_call_that_never_started(tmp_path, autojump_clock):
    """A step of two non-concurrent calls is cancelled while the first runs: it is cancelled
    through the port, the second never starts and is settled ABORTED_BEFORE_DISPATCH."""
    script = _script(tmp_path, {"text": "", "toolCalls": [
        {"name": "bash", "arguments": {"command": "sleep 100"}},
        {"name": "bash", "arguments": {"command": "true"}}]})
    async with trio.open_nursery() as nursery:
        port = FakePort(nursery, script)
        driver = TurnDriver.of(port)
        driver.start("hi")
        await _until(lambda: port.started)
        (first,) = port.started
        assert driver.cancel() is True
        await _until(lambda: port.end() is not None)
    assert port.cancelled == [first]
    codes = {cid: r.get("errorCode") for cid, r in port.settled.items()}
    assert codes[first] == "TOOL_CANCELLED"
    (second,) = set(codes) - {first}
    assert codes[second] == "ABORTED_BEFORE_DISPATCH" and second not in port.started
    assert port.end()["reason"] == "cancelled"
    assert ("state", "cancelling") in port.turn_lane.history


@pytest.mark.parametrize("autojump_clock", [trio.testing.MockClock(autojump_threshold=0)])
async def test_a_call_past_the_limit_is_settled_limit_exceeded(tmp_path, autojump_clock):
    script = _script(tmp_path, {"text": "", "toolCalls": [
        {"name": "bash", "arguments": {"command": "true"}}]}, {"text": "ok"})
    async with trio.open_nursery() as nursery:
        port = FakePort(nursery, script, limit=0)
        TurnDriver.of(port).start("hi")
        await _until(lambda: port.end() is not None)
    (result,) = port.settled.values()
    assert result["errorCode"] == "LIMIT_EXCEEDED" and not port.started
    assert port.end()["reason"] == "completed"


async def test_start_steer_and_their_refusals(tmp_path):
    script = _script(tmp_path, {"text": "x", "paceMs": 100000})
    async with trio.open_nursery() as nursery:
        port = FakePort(nursery, script)
        driver = TurnDriver.of(port)
        with pytest.raises(errors.NoTurn) as no_turn:
            driver.steer("early")
        assert no_turn.value.data == {"code": "NO_TURN"}
        turn_id = driver.start("hi")
        # the model "streams" slowly: wait for its first word (a step/start alone can come
        # before any text, and then no partial answer is recorded)
        await _until(lambda: port.turn_lane.turn and port.turn_lane.turn["text"])
        with pytest.raises(errors.TurnBusy) as busy:
            driver.start("again")
        assert busy.value.data == {"code": "TURN_RUNNING", "turnId": turn_id}
        for _ in range(16):
            driver.steer("more")
        with pytest.raises(errors.SteerLimit):
            driver.steer("one too many")
        driver.stop()
        await _until(lambda: port.end() is not None)
        port.open = False
        with pytest.raises(errors.SessionClosing):
            driver.start("late")
    assert port.end()["reason"] == "interrupted"
    # The partial answer is kept; the queued steers are recorded before turn/end.
    assert port.types() == ["turn/start", "message/user", "step/start", "message/assistant",
                            "step/end", *["message/user"] * 16, "turn/end"]
    assert port.log[3].data["partial"] is True


@pytest.mark.parametrize("autojump_clock", [trio.testing.MockClock(autojump_threshold=0)])
async def test_a_detaching_stop_leaves_a_waiting_turn_open_and_resume_goes_on(tmp_path,
                                                                            autojump_clock):
    """``stop("detach")`` while the step waits for its call records nothing (the turn stays
    open, a queued steer is kept); a new port with the same log takes the turn up
    (``resume_turn``), waits for the call's result and runs the next step to ``completed``."""
    from dshd.agent.resume import resumable_turns, resume_turn

    script = _script(tmp_path, {"text": "go", "toolCalls": [
        {"name": "bash", "arguments": {"command": "sleep 100"}}]}, {"text": "done"})
    async with trio.open_nursery() as nursery:
        port = FakePort(nursery, script)
        driver = TurnDriver.of(port)
        turn_id = driver.start("hi")
        await _until(lambda: port.started)
        (call,) = port.started
        driver.steer("and then this")
        driver.stop("detach")
        await _until(lambda: driver.turn is None)
    assert port.types() == ["turn/start", "message/user", "step/start", "message/assistant",
                            "tool/call", "message/user"]
    assert port.turn_lane.turn is None and port.cancelled == []
    assert resumable_turns(port.log, {call}) == {turn_id}

    async with trio.open_nursery() as nursery:
        after = FakePort(nursery, script)
        after.log = list(port.log)
        after.propose_call(call, "bash")
        assert await resume_turn(after, after.log, turn_id) is True
        await _until(lambda: after.turn_lane.turn is not None)
        assert after.turn_lane.turn["state"] == "waiting-tools"
        assert await resume_turn(after, after.log, turn_id) is False  # one turn at a time
        after.finish(call)
        await _until(lambda: after.end() is not None)
    assert after.end() == {"turnId": turn_id, "reason": "completed"}
    assert after.types()[6:] == ["tool/result", "step/end", "step/start", "message/assistant",
                                 "step/end", "turn/end"]
    assert [e.data["stepId"] for e in after.log if e.type == "step/start"] == ["s1", "s2"]
    assert after.log[-3].data["text"] == "done" and after.turn_lane.turn is None


@pytest.mark.parametrize("autojump_clock", [trio.testing.MockClock(autojump_threshold=0)])
@pytest.mark.parametrize("policy", ["detach", "cancel"])
async def test_a_stop_during_the_model_request_ends_the_turn_interrupted(tmp_path, autojump_clock,
                                                                         policy):
    script = _script(tmp_path, {"text": "a long answer " * 20, "paceMs": 1000})
    async with trio.open_nursery() as nursery:
        port = FakePort(nursery, script)
        driver = TurnDriver.of(port)
        turn_id = driver.start("hi")
        await _until(lambda: port.turn_lane.turn and port.turn_lane.turn["text"])
        driver.stop(policy)
        await _until(lambda: port.end() is not None)
    assert port.end() == {"turnId": turn_id, "reason": "interrupted",
                          "message": "dshd stopped during the turn"}


@pytest.mark.parametrize("autojump_clock", [trio.testing.MockClock(autojump_threshold=0)])
async def test_a_cancelling_stop_of_a_waiting_turn_still_ends_it(tmp_path, autojump_clock):
    script = _script(tmp_path, {"text": "go", "toolCalls": [
        {"name": "bash", "arguments": {"command": "sleep 100"}}]}, {"text": "done"})
    async with trio.open_nursery() as nursery:
        port = FakePort(nursery, script)
        driver = TurnDriver.of(port)
        driver.start("hi")
        await _until(lambda: port.started)
        driver.stop("cancel")
        await _until(lambda: port.end() is not None)
    assert port.end()["reason"] == "interrupted" and port.cancelled == list(port.started)


@pytest.mark.parametrize("autojump_clock", [trio.testing.MockClock(autojump_threshold=0)])
async def test_a_resumed_turn_can_be_cancelled(tmp_path, autojump_clock):
    """turn.cancel on a resumed turn cancels the call it waits for (through the port) and
    ends the turn ``cancelled``, with its open step closed first."""
    from dshd.agent.resume import resume_turn

    turn, call = "t-1", "m-1"
    log = [Ev(0, "turn/start", {"turnId": turn}),
           Ev(1, "message/user", {"turnId": turn, "text": "hi"}),
           Ev(2, "step/start", {"turnId": turn, "stepId": "s1"}),
           Ev(3, "message/assistant", {"turnId": turn, "stepId": "s1", "text": "go",
                                       "toolCalls": [{"callId": call, "name": "bash",
                                                      "arguments": "{}"}]}),
           Ev(4, "tool/call", {"callId": call, "name": "bash", "turnId": turn})]
    async with trio.open_nursery() as nursery:
        port = FakePort(nursery, _script(tmp_path, {"text": "never asked"}))
        port.log = list(log)
        port.propose_call(call, "bash")
        assert await resume_turn(port, port.log, turn) is True
        await _until(lambda: port.turn_lane.turn is not None)
        assert TurnDriver.of(port).cancel() is True
        await _until(lambda: port.end() is not None)
    assert port.cancelled == [call]
    assert port.types()[5:] == ["tool/result", "step/end", "turn/end"]
    assert port.end() == {"turnId": turn, "reason": "cancelled"}
