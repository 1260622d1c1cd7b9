"""Which open turns go on after a restart (``dshd.agent.resume.resumable_turns``, pure): the
rows of the module doc, on logs written the way the turn loop writes them."""

from __future__ import annotations

from dataclasses import dataclass

from dshd.agent.resume import open_turns, resumable_turns


@dataclass
class Ev:
    type: str
    data: dict


def turn_waiting(*calls: str, called: tuple[str, ...] | None = None,
                 results: tuple[str, ...] = (), turn: str = "t-1", step: str = "s2") -> list[Ev]:
    """A turn whose step ``step`` answered with ``calls``; ``called`` got their tool/call
    (default: all), ``results`` their tool/result."""
    called = calls if called is None else called
    evs = [Ev("turn/start", {"turnId": turn}), Ev("message/user", {"turnId": turn, "text": "go"}),
           Ev("step/start", {"turnId": turn, "stepId": "s1"}),
           Ev("message/assistant", {"turnId": turn, "stepId": "s1", "text": "look",
                                    "toolCalls": [{"callId": "m-old", "name": "bash",
                                                   "arguments": "{}"}]}),
           Ev("tool/call", {"callId": "m-old", "turnId": turn, "stepId": "s1"}),
           Ev("tool/result", {"callId": "m-old"}),
           Ev("step/end", {"turnId": turn, "stepId": "s1"}),
           Ev("step/start", {"turnId": turn, "stepId": step}),
           Ev("message/assistant", {"turnId": turn, "stepId": step, "text": "build it",
                                    "toolCalls": [{"callId": c, "name": "bash",
                                                   "arguments": "{}"} for c in calls]})]
    evs += [Ev("tool/call", {"callId": c, "turnId": turn, "stepId": step}) for c in called]
    evs += [Ev("tool/result", {"callId": c}) for c in results]
    return evs


def test_a_step_waiting_for_calls_that_come_back_is_resumable():
    evs = turn_waiting("m-1", "m-2")
    assert resumable_turns(evs, {"m-1", "m-2"}) == {"t-1"}
    turn = open_turns(evs)["t-1"]
    assert (turn.step, turn.step_id, turn.text, turn.calls) == (2, "s2", "build it",
                                                                ["m-1", "m-2"])


def test_calls_that_settled_or_never_started_do_not_stop_a_resume():
    evs = turn_waiting("m-1", "m-2", "m-3", called=("m-1", "m-2"), results=("m-1",))
    assert resumable_turns(evs, {"m-2"}) == {"t-1"}
    # every call already has a result: the step only lacks its step/end; it goes on
    assert resumable_turns(turn_waiting("m-1", results=("m-1",)), set()) == {"t-1"}


def test_a_started_call_that_does_not_come_back_makes_the_turn_interrupted():
    assert resumable_turns(turn_waiting("m-1", "m-2"), {"m-1"}) == set()


def test_a_model_request_in_flight_is_not_resumable():
    evs = turn_waiting("m-1", results=("m-1",))
    evs += [Ev("step/end", {"turnId": "t-1", "stepId": "s2"}),
            Ev("step/start", {"turnId": "t-1", "stepId": "s3"})]
    assert resumable_turns(evs, set()) == set()
    evs.append(Ev("message/assistant", {"turnId": "t-1", "stepId": "s3", "text": "hal",
                                        "partial": True}))
    assert resumable_turns(evs, set()) == set()  # a partial answer (cut short) is no answer


def test_an_answer_without_calls_or_no_open_step_is_not_resumable():
    evs = turn_waiting()
    assert resumable_turns(evs, set()) == set()
    evs = turn_waiting("m-1", results=("m-1",))
    evs.append(Ev("step/end", {"turnId": "t-1", "stepId": "s2"}))
    assert resumable_turns(evs, set()) == set()
    assert resumable_turns(turn_waiting("m-1")[:2], set()) == set()  # before its first step


def test_ended_turns_and_older_open_turns_are_not_resumable():
    ended = turn_waiting("m-1") + [Ev("turn/end", {"turnId": "t-1", "reason": "completed"})]
    assert resumable_turns(ended, {"m-1"}) == set()
    two = turn_waiting("m-1", turn="t-old") + turn_waiting("m-2", turn="t-new")
    assert list(open_turns(two)) == ["t-old", "t-new"]
    assert resumable_turns(two, {"m-1", "m-2"}) == {"t-new"}
    assert resumable_turns(two, {"m-1"}) == set()


def test_odd_events_are_skipped():
    evs = [Ev("turn/start", {}), Ev("step/start", {"turnId": 7}), Ev("tool/call", {}),
           Ev("message/assistant", {"turnId": "t-x", "toolCalls": "nope"})]
    assert resumable_turns(evs, set()) == set()
    evs = turn_waiting("m-1")
    evs[-2].data["toolCalls"].append("not a call")
    assert resumable_turns(evs, {"m-1"}) == {"t-1"}
