"""Crash repair: the closers a session needs after an unclean stop (STORAGE.md §5).

Theory of operation: `RepairState` is the fold of the events into what was opened and never
closed (``see`` one event at a time; serialisable, so a ``log/snapshot`` carries it and open
folds only the tail after it). `repair_closers` is pure: it turns a state into closers:

- tool calls announced in ``message/assistant.toolCalls`` with neither ``tool/call`` nor
  ``tool/result`` → ``tool/result`` with ``errorCode: TOOL_NOT_STARTED``;
- ``tool/call`` without ``tool/result`` → ``tool/result`` with ``TOOL_OUTCOME_UNKNOWN``, with
  the last checkpointed output window (sidecar, §6) when there is one — except a call whose
  approval was asked and never granted (no ``allowed-once``): the gate comes before the
  barrier, so its body cannot have started, and it is closed ``TOOL_NOT_STARTED`` (never less
  safe than ``TOOL_OUTCOME_UNKNOWN``: a grant is durable before any body runs);
- ``approval/asked`` without ``approval/decided`` → ``approval/decided {outcome: cancelled,
  by: repair}``;
- a ``step/start`` without ``step/end`` → ``step/end``; a ``turn/start`` without ``turn/end``
  → ``turn/end {reason: interrupted}``.

The order is fixed, innermost first, so that the log reads as a clean unwinding:
approvals (in the order they were asked), then tool results (in the order the calls were
first named), then steps (most recently opened first), then turns (most recently opened
first). Running it on a log that already ends with its closers yields nothing (idempotent).
Repair never re-runs anything; the writer appends the closers and flushes them
(`SessionLog.open_for_write(repair=True)`). After a daemon restart the session's resume plan
(``dshd.sessions.resume``, HOST.md §7) names what must *not* be closed (``keep_*``): calls
whose call host still runs or left its exit record, approvals that are asked again, turns that
resume; everything else is closed as above.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set as AbstractSet
from typing import Any

from .format import Event

TOOL_NOT_STARTED = "TOOL_NOT_STARTED"
TOOL_OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"

#: The sentences a person (or a model) acts on, verbatim from STORAGE.md §5.
NOT_STARTED_TEXT = "interrupted before it started; retry if still needed"
#: ``(output_max_bytes, output_max_lines)`` by default (EXEC.md §2), for readers without a config.
DEFAULT_LIMITS = (51_200, 2_000)
OUTCOME_UNKNOWN_TEXT = (
    "it may or may not have run; retry only if read-only or idempotent, "
    "otherwise check the outside world first"
)
LAST_OUTPUT_INTRO = "last output checkpointed before the interruption:"
NOT_GRANTED_TEXT = (
    "interrupted while it waited for approval, so it did not run; retry if still needed"
)


def _window_parts(window: Any) -> tuple[str | None, dict]:
    """(text, details) of a pending window: a str, or a ToolOutput value (PROTOCOL.md §3.3)."""
    if isinstance(window, str):
        return window, {}
    if not isinstance(window, Mapping):
        return None, {}
    text_parts = []
    for block in window.get("content") or []:
        if isinstance(block, Mapping) and isinstance(block.get("text"), str):
            text_parts.append(block["text"])
    details: dict = {}
    if isinstance(window.get("truncation"), Mapping):
        details["truncation"] = dict(window["truncation"])
    inner = window.get("details")
    if isinstance(inner, Mapping) and isinstance(inner.get("spillPath"), str):
        details["spillPath"] = inner["spillPath"]
    return "".join(text_parts), details


class RepairState:
    """What the events opened and never closed, folded one event at a time (module doc).

    Bounded by what is open: a call leaves with its ``tool/result``, an approval with its
    decision, a step or turn with its end. Serialisable (`to_json` / `from_json`, the
    ``repair`` of a ``log/snapshot``), so the fold can start at a snapshot: for any split of a
    log, ``from_json(fold(prefix).to_json())`` then ``see`` of the rest equals the fold of all.
    """

    def __init__(self) -> None:
        #: callId (first-mention order) -> its tool/call ``{"seq","time","data"}``, or None
        #: while it is only named (message/assistant toolCalls).
        self.calls: dict[str, dict | None] = {}
        self.gates: dict[str, bool] = {}  # callId with an approval asked -> allowed-once seen
        self.approvals: dict[str, dict] = {}  # approvalId (asked order) -> {"seq","data"}
        self.steps: dict[tuple, None] = {}  # (turnId, stepId), most recently opened last
        self.turns: dict = {}  # turnId -> seq of its turn/start, most recently opened last

    # --- what resume and the owner read ------------------------------------------------------
    @property
    def open_calls(self) -> dict[str, dict]:
        """callId -> ``{"seq", "time", "data"}`` of each ``tool/call`` without ``tool/result``."""
        return {cid: c for cid, c in self.calls.items() if c is not None}

    @property
    def named_calls(self) -> list[str]:
        """callIds named by ``message/assistant`` with neither ``tool/call`` nor result."""
        return [cid for cid, c in self.calls.items() if c is None]

    @property
    def open_approvals(self) -> dict[str, dict]:
        """approvalId -> ``{"seq", "data"}`` (the ``approval/asked`` data) not yet decided."""
        return dict(self.approvals)

    @property
    def open_turns(self) -> dict:
        """turnId -> seq of its ``turn/start``, for turns without ``turn/end`` (open order)."""
        return dict(self.turns)

    @property
    def open_steps(self) -> list[tuple]:
        """``(turnId, stepId)`` of steps without ``step/end`` (open order)."""
        return list(self.steps)

    # --- the fold ------------------------------------------------------------------------------
    def see(self, ev: Event) -> None:
        """Fold one event (any type; unknown or odd data is ignored)."""
        d, t = ev.data, ev.type
        if t == "message/assistant":
            for tc in d.get("toolCalls") or []:
                if isinstance(tc, Mapping) and isinstance(tc.get("callId"), str):
                    self.calls.setdefault(tc["callId"], None)
        elif t == "tool/call":
            cid = d.get("callId")
            if isinstance(cid, str):
                entry = {"seq": ev.seq, "time": ev.time, "data": d}
                if self.calls.get(cid) is None:
                    self.calls.setdefault(cid, None)
                    self.calls[cid] = entry  # keeps its first-mention position
        elif t == "tool/result":
            cid = d.get("callId")
            if isinstance(cid, str):
                self.calls.pop(cid, None)
                self.gates.pop(cid, None)
        elif t == "approval/asked":
            aid = d.get("approvalId")
            if isinstance(aid, str):
                self.approvals.setdefault(aid, {"seq": ev.seq, "data": d})
                if isinstance(d.get("callId"), str):
                    self.gates.setdefault(d["callId"], False)
        elif t == "approval/decided":
            asked = self.approvals.pop(d.get("approvalId"), None) if isinstance(
                d.get("approvalId"), str) else None
            cid = None if asked is None else asked["data"].get("callId")
            if d.get("outcome") == "allowed-once" and isinstance(cid, str) and cid in self.gates:
                self.gates[cid] = True
        elif t == "step/start":
            key = (d.get("turnId"), d.get("stepId"))
            self.steps.pop(key, None)
            self.steps[key] = None  # re-opened: most recent position
        elif t == "step/end":
            self.steps.pop((d.get("turnId"), d.get("stepId")), None)
        elif t == "turn/start":
            self.turns.pop(d.get("turnId"), None)
            self.turns[d.get("turnId")] = ev.seq
        elif t == "turn/end":
            self.turns.pop(d.get("turnId"), None)

    def see_all(self, events: Iterable[Event]) -> RepairState:
        for ev in events:
            self.see(ev)
        return self

    # --- serialisation -------------------------------------------------------------------------
    def to_json(self) -> dict:
        """A JSON-able dict (the ``repair`` of a snapshot); `from_json` reads it back."""
        return {
            "calls": [[cid, c] for cid, c in self.calls.items()],
            "gates": [[cid, g] for cid, g in self.gates.items()],
            "approvals": [[aid, a] for aid, a in self.approvals.items()],
            "steps": [list(k) for k in self.steps],
            "turns": [[tid, seq] for tid, seq in self.turns.items()],
        }

    @classmethod
    def from_json(cls, d: Any) -> RepairState:
        """The state `to_json` wrote. Raises ValueError when ``d`` is not of that shape."""
        st = cls()
        try:
            st.calls = {_str(cid): _entry(c) for cid, c in d["calls"]}
            st.gates = {_str(cid): bool(g) for cid, g in d["gates"]}
            st.approvals = {_str(aid): _entry(a, optional=False) for aid, a in d["approvals"]}
            st.steps = {(tid, sid): None for tid, sid in d["steps"]}
            st.turns = {tid: int(seq) for tid, seq in d["turns"]}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a repair state ({e!r})") from None
        return st

    def copy(self) -> RepairState:
        return RepairState.from_json(self.to_json())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RepairState) and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]

    def result(self, cid: str, windows: Mapping[str, Any], limits: tuple[int, int]) -> dict:
        """The ``tool/result`` closer of an unsettled call ``cid``; ``limits`` are the output
        window's ``(maxBytes, maxLines)`` for a result without a checkpointed window."""
        never_granted = cid in self.gates and not self.gates[cid]
        called = self.calls.get(cid) is not None
        details: dict = {}
        if called and never_granted:
            content, code = NOT_GRANTED_TEXT, TOOL_NOT_STARTED
        elif called:
            content, code = OUTCOME_UNKNOWN_TEXT, TOOL_OUTCOME_UNKNOWN
            if cid in windows:
                text, details = _window_parts(windows[cid])
                if text:
                    content = f"{OUTCOME_UNKNOWN_TEXT}\n\n{LAST_OUTPUT_INTRO}\n{text}"
        else:
            content, code = NOT_STARTED_TEXT, TOOL_NOT_STARTED
        if "truncation" not in details:  # PROTOCOL.md §3.2: always present, zero totals
            details["truncation"] = {"truncated": False, "truncatedBy": None, "totalBytes": 0,
                                     "totalLines": 0, "maxBytes": limits[0],
                                     "maxLines": limits[1]}
        return {"callId": cid, "isError": True, "content": content, "details": details,
                "errorCode": code}


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{v!r} is not a string")
    return v


def _entry(c: Any, optional: bool = True) -> dict | None:
    if c is None and optional:
        return None
    if not isinstance(c, dict) or not isinstance(c.get("seq"), int) or not isinstance(
            c.get("data"), dict):
        raise ValueError(f"{c!r} is not an event entry")
    return c


def _state_of(state: RepairState | None, events: Iterable[Event] | None) -> RepairState:
    if state is not None and events is not None:
        raise TypeError("give a RepairState or events=, not both")
    if state is None:
        return RepairState().see_all(events or ())
    if not isinstance(state, RepairState):  # a list of events (the old form)
        return RepairState().see_all(state)
    return state


def repair_closers(
    state: RepairState | None = None, pending_windows: Mapping[str, Any] | None = None,
    limits: tuple[int, int] = DEFAULT_LIMITS, *, events: Iterable[Event] | None = None,
    keep_calls: AbstractSet[str] = frozenset(), keep_approvals: AbstractSet[str] = frozenset(),
    keep_turns: AbstractSet[str] = frozenset(),
) -> list[tuple[str, dict]]:
    """The ``(type, data)`` closers for ``state`` (STORAGE.md §5), in a deterministic order.

    ``state``: the `RepairState` folded through the last event (``events=``: fold these
    instead; a list of events passed as ``state`` is folded too, the old form).
    ``pending_windows`` maps callId → the last checkpointed output of that call: its text
    (str) or the ToolOutput value read back from the sidecar (``content[].text``,
    ``truncation``, ``details.spillPath``). A ``TOOL_OUTCOME_UNKNOWN`` result appends the
    text to its content and carries ``truncation``/``spillPath`` in ``details``; every other
    result has zero totals with ``limits`` (``(maxBytes, maxLines)``, the config's window).
    Tool results have the shape ``{callId, isError: true, content: str, details: {...},
    errorCode}``. Pure; never raises on odd data (events with missing keys are skipped).

    ``keep_calls`` / ``keep_approvals`` / ``keep_turns``: what the daemon resumes after a
    restart (``dshd.sessions.resume``: a call whose host lives or left its exit record, an
    approval asked again, a turn that goes on) gets no closer -- no ``tool/result``, no
    ``approval/decided``, no ``turn/end`` and no ``step/end`` for the turn's open steps.
    Offline (``fsck``) they are empty: what a repair without a daemon would append.
    """
    windows = pending_windows or {}
    seen = _state_of(state, events)
    closers: list[tuple[str, dict]] = [
        ("approval/decided", {"approvalId": aid, "outcome": "cancelled", "by": "repair"})
        for aid in seen.approvals if aid not in keep_approvals
    ]
    closers += [("tool/result", seen.result(cid, windows, limits))
                for cid in seen.calls if cid not in keep_calls]
    closers += [("step/end", {"turnId": turn_id, "stepId": step_id})
                for turn_id, step_id in reversed(seen.steps) if turn_id not in keep_turns]
    closers += [("turn/end", {"turnId": turn_id, "reason": "interrupted"})
                for turn_id in reversed(seen.turns) if turn_id not in keep_turns]
    return closers


def unresolved_calls(state: RepairState | None = None, *,
                     events: Iterable[Event] | None = None) -> list[str]:
    """callIds with a ``tool/call`` and no ``tool/result``, in order (the calls whose pending
    output window the repair wants; STORAGE.md §5, §6)."""
    return list(_state_of(state, events).open_calls)
