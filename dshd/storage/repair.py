"""Crash repair: the closers a session needs after an unclean stop (STORAGE.md §5).

Theory of operation: `repair_closers` is pure. It walks the events once and keeps track of
what was opened and never closed:

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

from collections.abc import Mapping, Set as AbstractSet
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


class _Open:
    """What the events opened and never closed, gathered in one walk (`repair_closers`)."""

    def __init__(self) -> None:
        self.named: dict[str, None] = {}  # callId in first-mention order (dicts keep it)
        self.called: set[str] = set()
        self.resulted: set[str] = set()
        self.asked: dict[str, None] = {}
        self.decided: set[str] = set()
        self.gated: dict[str, str] = {}  # approvalId -> callId
        self.granted: set[str] = set()  # callIds with an allowed-once decision
        self.steps: dict[tuple[str, str], None] = {}
        self.turns: dict[str, None] = {}

    def see(self, ev: Event) -> None:
        d, t = ev.data, ev.type
        if t == "message/assistant":
            for tc in d.get("toolCalls") or []:
                if isinstance(tc, Mapping) and isinstance(tc.get("callId"), str):
                    self.named.setdefault(tc["callId"], None)
        elif t in ("tool/call", "tool/result"):
            cid = d.get("callId")
            if isinstance(cid, str):
                self.named.setdefault(cid, None)
                (self.called if t == "tool/call" else self.resulted).add(cid)
        elif t == "approval/asked":
            aid = d.get("approvalId")
            if isinstance(aid, str):
                self.asked.setdefault(aid, None)
                if isinstance(d.get("callId"), str):
                    self.gated[aid] = d["callId"]
        elif t == "approval/decided":
            aid = d.get("approvalId")
            if isinstance(aid, str):
                self.decided.add(aid)
                if d.get("outcome") == "allowed-once" and aid in self.gated:
                    self.granted.add(self.gated[aid])
        elif t == "step/start":
            key = (d.get("turnId"), d.get("stepId"))
            self.steps.pop(key, None)
            self.steps[key] = None  # re-opened: most recent position
        elif t == "step/end":
            self.steps.pop((d.get("turnId"), d.get("stepId")), None)
        elif t == "turn/start":
            self.turns.pop(d.get("turnId"), None)
            self.turns[d.get("turnId")] = None
        elif t == "turn/end":
            self.turns.pop(d.get("turnId"), None)

    def result(self, cid: str, windows: Mapping[str, Any], limits: tuple[int, int]) -> dict:
        """The ``tool/result`` closer of an unsettled call ``cid``; ``limits`` are the output
        window's ``(maxBytes, maxLines)`` for a result without a checkpointed window."""
        never_granted = cid in self.gated.values() and cid not in self.granted
        details: dict = {}
        if cid in self.called and never_granted:
            content, code = NOT_GRANTED_TEXT, TOOL_NOT_STARTED
        elif cid in self.called:
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


def repair_closers(
    events: list[Event], pending_windows: Mapping[str, Any] | None = None,
    limits: tuple[int, int] = DEFAULT_LIMITS, *,
    keep_calls: AbstractSet[str] = frozenset(), keep_approvals: AbstractSet[str] = frozenset(),
    keep_turns: AbstractSet[str] = frozenset(),
) -> list[tuple[str, dict]]:
    """The ``(type, data)`` closers for ``events`` (STORAGE.md §5), in a deterministic order.

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
    seen = _Open()
    for ev in events:
        seen.see(ev)
    closers: list[tuple[str, dict]] = [
        ("approval/decided", {"approvalId": aid, "outcome": "cancelled", "by": "repair"})
        for aid in seen.asked if aid not in seen.decided and aid not in keep_approvals
    ]
    closers += [("tool/result", seen.result(cid, windows, limits))
                for cid in seen.named if cid not in seen.resulted and cid not in keep_calls]
    closers += [("step/end", {"turnId": turn_id, "stepId": step_id})
                for turn_id, step_id in reversed(seen.steps) if turn_id not in keep_turns]
    closers += [("turn/end", {"turnId": turn_id, "reason": "interrupted"})
                for turn_id in reversed(seen.turns) if turn_id not in keep_turns]
    return closers


def unresolved_calls(events: list[Event]) -> list[str]:
    """callIds with a ``tool/call`` and no ``tool/result``, in order (the calls whose pending
    output window the repair wants; STORAGE.md §5, §6)."""
    called: dict[str, None] = {}
    resulted: set[str] = set()
    for ev in events:
        cid = ev.data.get("callId")
        if not isinstance(cid, str):
            continue
        if ev.type == "tool/call":
            called.setdefault(cid, None)
        elif ev.type == "tool/result":
            resulted.add(cid)
    return [cid for cid in called if cid not in resulted]
