"""The verdicts of ``dsh fsck`` through dshd (STORAGE.md §5).

Theory of operation: a session is in one of a few states, each a ``Verdict``:

- ``ok``: the log reads clean and opening it appended nothing;
- ``repaired``: opening it for write appended crash closers. ``session.list`` reads logs
  without opening them, so its ``lastSeq`` against the one of ``session.get`` (which opens the
  session, and repairs it) says whether anything was appended; ``repairs_in`` reads the new
  events and names the closers: ``TOOL_OUTCOME_UNKNOWN`` / ``TOOL_NOT_STARTED`` results,
  approvals decided ``by: repair``, turns ended ``interrupted`` (and, with those, closed steps).
  New events without any closer are live activity: the session is ``ok``;
- ``damaged``: the daemon refuses to open it (a corrupt frame, a missing log, a newer format);
- ``unchecked``: the daemon could not open it for another reason (locked by another process,
  the open-session limit): neither good nor known bad.

``Verdict.failed`` (damaged, unchecked) decides the exit status of ``dsh fsck``. Reading the
logs without a daemon is ``dsh fsck --offline``, which runs ``python -m dshd fsck --offline``
(the daemon's package owns its storage format; this client never reads the files itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["Verdict", "repairs_in", "closer_label", "REPAIR_CODES"]

#: The errorCodes of the results a repair appends (STORAGE.md §5, EXEC.md §1).
REPAIR_CODES = ("TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED")


@dataclass
class Verdict:
    session_id: str
    #: ok | repaired | damaged | unchecked
    state: str
    #: Why it is damaged / unchecked (one line).
    reason: str | None = None
    #: What opening it appended, one label each.
    repairs: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.state in ("damaged", "unchecked")

    def text(self) -> str:
        """The verdict in one line (without the session id)."""
        if self.state in ("damaged", "unchecked"):
            return f"{self.state}: {self.reason}"
        if self.state == "repaired":
            return "repaired: " + ", ".join(self.repairs)
        return "ok"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sessionId": self.session_id, "state": self.state}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.repairs:
            out["repairs"] = list(self.repairs)
        return out


def closer_label(type_: str, data: Any) -> str | None:
    """A short label for a crash closer (``None`` when the event is not one)."""
    if not isinstance(data, dict):
        return None
    if type_ == "tool/result" and data.get("errorCode") in REPAIR_CODES:
        return f"call {data.get('callId')} {data['errorCode']}"
    if type_ == "approval/decided" and data.get("by") == "repair":
        return f"approval {data.get('approvalId')} {data.get('outcome', 'cancelled')}"
    if type_ == "turn/end" and data.get("reason") == "interrupted":
        return f"turn {data.get('turnId')} interrupted"
    return None


def repairs_in(events: Iterable[dict[str, Any]]) -> list[str]:
    """Labels of the crash closers among ``events`` (session.events objects), in order.

    A ``step/end`` is a closer only beside other closers: steps also end normally.
    """
    labels: list[str] = []
    steps: list[str] = []
    for event in events:
        type_, data = event.get("type"), event.get("data")
        label = closer_label(str(type_), data)
        if label is not None:
            labels.append(label)
        elif type_ == "step/end" and isinstance(data, dict):
            steps.append(f"step {data.get('stepId')} closed")
    return labels + steps if labels else []
