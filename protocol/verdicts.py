"""The verdict of ``dsh fsck`` on one session (STORAGE.md §5), online or offline.

Theory of operation: the two checks of a session's log -- the client's, through a running
dshd (``client.fsck``: ``ok``, ``repaired``, ``damaged``, ``unchecked``), and the daemon's
offline one reading the files (``dshd.storage.fsck``: ``ok``, ``torn``, ``needs-repair``,
``damaged``, ``unchecked``) -- say what they found as one :class:`Verdict`, so a session reads
the same in both: one line (:meth:`Verdict.text`) or one JSON object (:meth:`Verdict.to_json`).
``failed`` (damaged, unchecked) decides the exit status. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Verdict"]


@dataclass
class Verdict:
    session_id: str
    #: ok | torn | needs-repair | damaged | unchecked (the client's online check adds repaired)
    state: str
    #: Why it is damaged / unchecked (one line).
    reason: str | None = None
    #: What opening it would append (or, online, appended), one label each.
    repairs: list[str] = field(default_factory=list)
    #: The byte offset of the damage or of the torn tail.
    offset: int | None = None
    #: Torn: how many records were recovered from the torn frame.
    recovered: int | None = None
    #: True when ``repairs`` are closers still to be appended (not appended yet).
    pending: bool = False

    @property
    def failed(self) -> bool:
        return self.state in ("damaged", "unchecked")

    def text(self) -> str:
        """The verdict in one line (without the session id)."""
        if self.state in ("damaged", "unchecked"):
            return f"{self.state}: {self.reason}"
        parts: list[str] = []
        if self.state == "torn":
            parts.append(f"torn tail at byte {self.offset}: {_records(self.recovered or 0)} "
                         "recovered (the daemon drops the torn bytes on its next write)")
        elif self.state == "repaired":
            parts.append("repaired: " + ", ".join(self.repairs))
        elif self.state != "needs-repair":
            parts.append("ok")
        if self.pending and self.repairs:
            parts.append("needs repair on open: " + ", ".join(self.repairs))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sessionId": self.session_id, "state": self.state}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.repairs:
            out["needsRepair" if self.pending else "repairs"] = list(self.repairs)
        if self.offset is not None:
            out["offset"] = self.offset
        if self.recovered is not None:
            out["recovered"] = self.recovered
        return out


def _records(n: int) -> str:
    return f"{n} record" + ("" if n == 1 else "s")
