"""The approval gate: "may this call run, this once?" (PROTOCOL.md §3.4, EXEC.md §1).

Theory of operation: every call passes :meth:`ApprovalDesk.gate` before its checkpoint
barrier, and every gated call leaves the audit pair ``approval/asked`` + ``approval/decided``
with one ``approvalId``. The decision table, first match wins:

==========================================  ===============  ==========
situation                                   outcome          by
==========================================  ===============  ==========
caller pre-approved (``approved: true``)    allowed-once     caller
session policy ``never``                    rejected         policy
no answerer attached at ask time            unavailable      policy
an answerer decides allow / reject          allowed-once /   answerer
                                            rejected
the last answerer leaves while pending      unavailable      policy
the call is cancelled while pending         cancelled        caller
==========================================  ===============  ==========

Only ``allowed-once`` returns; every other outcome raises ``CallFailed`` with its code and a
sentence (``dshd.results``, via ``WHY``), so the call settles without running (fail closed). An audit append that fails
rejects the call: there is no unrecorded grant. A pending request is in the lane view's
``approvals`` (so an answerer that attaches later sees it in its base batch) until decided.
Answerers are connections that said ``capabilities.approvals`` and hold a subscription to the
session; :meth:`answerer_joined` / :meth:`answerer_left` keep the count.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .results import sentence

if TYPE_CHECKING:
    from .sessions.session import Call, Session

#: why -> (errorCode, variant of ``dshd.results.SENTENCES``) of an outcome that does not run.
WHY = {
    "rejected-policy": ("APPROVAL_REJECTED", "policy"),
    "rejected-answerer": ("APPROVAL_REJECTED", "answerer"),
    "audit": ("APPROVAL_REJECTED", "audit"),
    "unavailable": ("APPROVAL_UNAVAILABLE", ""),
    "unavailable-left": ("APPROVAL_UNAVAILABLE", "left"),
    "cancelled": ("APPROVAL_CANCELLED", ""),
}


def _refused(why: str) -> "CallFailed":
    from .sessions.session import CallFailed

    code, variant = WHY[why]
    return CallFailed(code, sentence(code, variant))


class AlreadyDecided(Exception):
    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class ApprovalNotFound(LookupError):
    pass


@dataclass
class _Pending:
    approval_id: str
    call_id: str
    decided: trio.Event = field(default_factory=trio.Event)
    outcome: str | None = None
    by: str | None = None
    why: str | None = None


def summary_of(call: "Call") -> str:
    """The exact command a person is asked about (never a truncated label)."""
    if call.name == "bash":
        return str(call.arguments.get("command", ""))
    return f"{call.name} {call.arguments}"


class ApprovalDesk:
    """One per session: pending requests, answerer count, decisions (see module doc)."""

    def __init__(self, session: "Session") -> None:
        self.session = session
        self.answerers: set[str] = set()
        self.pending: dict[str, _Pending] = {}
        #: Outcomes of decided approvals (from the log and from this run): -32011 answers.
        self.decided: dict[str, str] = {}

    # ------------------------------------------------------------------ answerers
    def answerer_joined(self, subscription_id: str) -> None:
        self.answerers.add(subscription_id)

    def answerer_left(self, subscription_id: str) -> None:
        self.answerers.discard(subscription_id)
        if not self.answerers:
            for p in list(self.pending.values()):
                self._decide(p, "unavailable", "policy", "unavailable-left")

    # ------------------------------------------------------------------ deciding
    def _decide(self, p: _Pending, outcome: str, by: str, why: str | None = None) -> None:
        if p.outcome is None:
            p.outcome, p.by, p.why = outcome, by, why
            p.decided.set()

    def decide(self, approval_id: str, decision: str) -> str:
        """Apply a person's decision (``allow`` | ``reject``); returns the outcome.

        Raises AlreadyDecided (-32011) or ApprovalNotFound (-32007).
        """
        p = self.pending.get(approval_id)
        if p is None or p.outcome is not None:
            outcome = p.outcome if p is not None else self.decided.get(approval_id)
            if outcome is not None:
                raise AlreadyDecided(outcome)
            raise ApprovalNotFound(approval_id)
        outcome = "allowed-once" if decision == "allow" else "rejected"
        self._decide(p, outcome, "answerer", "rejected-answerer" if outcome == "rejected" else None)
        return outcome

    def absorb(self, type_: str, data: dict) -> None:
        """Fold a logged approval event into ``decided`` (on open)."""
        if type_ == "approval/decided":
            self.decided[data["approvalId"]] = data["outcome"]

    # ------------------------------------------------------------------ the gate
    async def gate(self, call: "Call") -> None:
        """Return on ``allowed-once``; raise CallFailed otherwise (module doc)."""
        session = self.session
        approval_id = "a-" + secrets.token_hex(6)
        summary = summary_of(call)
        try:
            session.log.append(
                "approval/asked",
                {"approvalId": approval_id, "callId": call.call_id, "tool": call.name,
                 "summary": summary},
            )
        except Exception:
            raise _refused("audit") from None
        p = _Pending(approval_id, call.call_id)
        if call.approved:
            self._decide(p, "allowed-once", "caller")
        elif session.policy == "never":
            self._decide(p, "rejected", "policy", "rejected-policy")
        elif not self.answerers:
            self._decide(p, "unavailable", "policy", "unavailable")
        else:
            self.pending[approval_id] = p
            session.tracker.set(
                ["approvals", approval_id],
                {"callId": call.call_id, "tool": call.name, "summary": summary,
                 "askedAt": time.time_ns() // 1_000_000},
            )
            session.publisher.mark_dirty()
            try:
                async with trio.open_nursery() as nursery:

                    async def watch_cancel() -> None:
                        await call.cancel.wait()
                        self._decide(p, "cancelled", "caller", "cancelled")

                    nursery.start_soon(watch_cancel)
                    await p.decided.wait()
                    nursery.cancel_scope.cancel()
            finally:
                self.pending.pop(approval_id, None)
                if approval_id in session.tracker.value["approvals"]:
                    session.tracker.delete(["approvals", approval_id])
                    session.publisher.mark_dirty()
                if p.outcome is None:  # the daemon is stopping under us
                    self._decide(p, "cancelled", "caller", "cancelled")
                    self._record(p)
        assert p.outcome is not None and p.by is not None
        if not self._record(p):
            raise _refused("audit")
        if p.outcome == "allowed-once":
            return
        raise _refused(p.why or p.outcome)

    def _record(self, p: _Pending) -> bool:
        """Append ``approval/decided``; False when the append failed (then nothing runs)."""
        self.decided[p.approval_id] = p.outcome  # type: ignore[assignment]
        try:
            self.session.log.append(
                "approval/decided", {"approvalId": p.approval_id, "outcome": p.outcome, "by": p.by}
            )
        except Exception:
            return False
        return True
