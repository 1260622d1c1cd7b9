"""RepairState and the settings fold: the fold of all events equals the fold restarted from a
serialised snapshot of any prefix (STORAGE.md §7), and the closers match the whole-log walk."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from dshd.storage.format import Event
from dshd.storage.repair import RepairState, repair_closers, unresolved_calls
from dshd.storage.snapshot import EMPTY_SETTINGS, fold_settings, snapshot_problem

CALLS = [f"c{i}" for i in range(5)]
APPROVALS = [f"a{i}" for i in range(4)]
TURNS = ["t0", "t1", "t2"]


def _event_data():
    """(type, data) of events that touch every branch of the fold, with colliding ids."""
    return st.one_of(
        st.builds(lambda ids: ("message/assistant", {"text": "x", "toolCalls": [
            {"callId": c, "name": "bash", "arguments": "{}"} for c in ids]}),
            st.lists(st.sampled_from(CALLS), max_size=3)),
        st.builds(lambda c: ("tool/call", {"callId": c, "name": "bash", "arguments": "{}"}),
                  st.sampled_from(CALLS)),
        st.builds(lambda c: ("tool/result", {"callId": c, "isError": False, "content": "ok",
                                              "details": {}}), st.sampled_from(CALLS)),
        st.builds(lambda a, c: ("approval/asked", {"approvalId": a, "callId": c, "tool": "bash",
                                                    "summary": "s"}),
                  st.sampled_from(APPROVALS), st.sampled_from(CALLS)),
        st.builds(lambda a, o: ("approval/decided", {"approvalId": a, "outcome": o,
                                                      "by": "caller"}),
                  st.sampled_from(APPROVALS), st.sampled_from(["allowed-once", "denied"])),
        st.builds(lambda t, s: ("step/start", {"turnId": t, "stepId": s}),
                  st.sampled_from(TURNS), st.sampled_from(["s0", "s1"])),
        st.builds(lambda t, s: ("step/end", {"turnId": t, "stepId": s}),
                  st.sampled_from(TURNS), st.sampled_from(["s0", "s1"])),
        st.builds(lambda t: ("turn/start", {"turnId": t}), st.sampled_from(TURNS)),
        st.builds(lambda t: ("turn/end", {"turnId": t, "reason": "completed"}),
                  st.sampled_from(TURNS)),
        st.builds(lambda p: ("approval/policy", {"policy": p, "source": "config"}),
                  st.sampled_from(["ask", "never"])),
        st.builds(lambda m: ("sandbox/mode", {"mode": m, "source": "config"}),
                  st.sampled_from(["read-only", "workspace-write"])),
        st.builds(lambda u: ("session/owner", {"uid": u}), st.integers(0, 3)),
    )


def _events(pairs) -> list[Event]:
    return [Event(seq=i, time=1_000 + i, type=t, data=d) for i, (t, d) in enumerate(pairs)]


def _fold_settings(events, start=None) -> dict:
    out = dict(EMPTY_SETTINGS if start is None else start)
    for ev in events:
        out = fold_settings(out, ev)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(_event_data(), max_size=40), st.data())
def test_fold_of_all_equals_snapshot_of_prefix_plus_rest(pairs, data):
    events = _events(pairs)
    cut = data.draw(st.integers(0, len(events)))
    whole = RepairState().see_all(events)
    # The snapshot goes through JSON text, as it does on disk.
    prefix = json.loads(json.dumps(RepairState().see_all(events[:cut]).to_json()))
    resumed = RepairState.from_json(prefix).see_all(events[cut:])
    assert resumed.to_json() == whole.to_json()
    assert repair_closers(resumed) == repair_closers(whole) == repair_closers(events=events)
    assert unresolved_calls(resumed) == unresolved_calls(events=events)
    settings_prefix = json.loads(json.dumps(_fold_settings(events[:cut])))
    assert _fold_settings(events[cut:], settings_prefix) == _fold_settings(events)


@settings(max_examples=200, deadline=None)
@given(st.lists(_event_data(), max_size=40))
def test_state_stays_bounded_by_what_is_open(pairs):
    state = RepairState().see_all(_events(pairs))
    for cid, entry in state.open_calls.items():
        assert entry["data"]["callId"] == cid
    # Every call whose last word was its result has left the state.
    last = {}
    for t, d in pairs:
        if t in ("tool/call", "tool/result", "approval/asked"):
            last[d["callId"]] = t
        for tc in d.get("toolCalls") or []:
            last[tc["callId"]] = t
    for cid, t in last.items():
        if t == "tool/result":
            assert cid not in state.calls and cid not in state.gates


def test_closers_of_a_crashed_log_match_the_walk_of_every_event():
    pairs = [
        ("turn/start", {"turnId": "t"}),
        ("step/start", {"turnId": "t", "stepId": "s"}),
        ("message/assistant", {"text": "", "toolCalls": [
            {"callId": "named", "name": "bash", "arguments": "{}"},
            {"callId": "run", "name": "bash", "arguments": "{}"},
            {"callId": "gated", "name": "bash", "arguments": "{}"}]}),
        ("tool/call", {"callId": "run", "name": "bash", "arguments": "{}"}),
        ("tool/call", {"callId": "gated", "name": "bash", "arguments": "{}"}),
        ("approval/asked", {"approvalId": "a", "callId": "gated", "tool": "bash",
                            "summary": "s"}),
    ]
    events = _events(pairs)
    state = RepairState().see_all(events)
    assert list(state.open_calls) == ["run", "gated"]
    assert state.open_calls["run"]["seq"] == 3
    assert state.named_calls == ["named"]
    assert state.open_approvals == {"a": {"seq": 5, "data": pairs[5][1]}}
    assert state.open_turns == {"t": 0} and state.open_steps == [("t", "s")]
    codes = {d["callId"]: d["errorCode"] for t, d in repair_closers(state) if t == "tool/result"}
    assert codes == {"named": "TOOL_NOT_STARTED", "run": "TOOL_OUTCOME_UNKNOWN",
                     "gated": "TOOL_NOT_STARTED"}


def test_a_bad_repair_state_or_snapshot_is_refused():
    assert snapshot_problem({"through": 4}, 5) is not None
    good = {"through": 4, "verifiedThrough": 100, "prev": None,
            "repair": RepairState().to_json(), "settings": dict(EMPTY_SETTINGS), "session": {}}
    assert snapshot_problem(good, 5) is None
    assert "folds through" in snapshot_problem(good, 6)
    assert "repair" in snapshot_problem({**good, "repair": {"calls": 3}}, 5)
    assert "previous" in snapshot_problem({**good, "prev": 100}, 5)
