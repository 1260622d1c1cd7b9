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
the ask cannot be made durable              rejected         policy
an answerer decides allow / reject          allowed-once /   answerer
                                            rejected
the last answerer leaves while pending      unavailable      policy
the call is cancelled while pending         cancelled        caller
*re-asked after a restart* (:meth:`reask`):
session policy ``never``                    rejected         policy
no answerer within ``reask_grace_seconds``  unavailable      policy
an answerer decides allow / reject          allowed-once /   answerer
                                            rejected
the last answerer leaves after the grace    unavailable      policy
the call is cancelled while pending         cancelled        caller
==========================================  ===============  ==========

Only ``allowed-once`` returns; every other outcome raises ``CallFailed`` with its code and a
sentence (``dshd.results``, via ``WHY``), so the call settles without running (fail closed). An
audit append that fails rejects the call: there is no unrecorded grant. A request is shown only
once its ``approval/asked`` is durable (one that cannot be made durable rejects the call, as a
failed append does), so every request a person sees survives a crash and is asked again after
the start (below). A pending request is in the lane view's ``approvals`` (so an answerer that
attaches later sees it in its base batch) until decided. Answerers are connections that said ``capabilities.approvals`` and hold a
subscription to the session; :meth:`answerer_joined` / :meth:`answerer_left` keep the count.

**Re-ask** (HOST.md §7): a call whose ``approval/asked`` has no ``approval/decided`` when the
daemon stopped (or crashed) is asked again when its session is opened after the start, by
:meth:`ApprovalDesk.reask` with the *same* ``approvalId`` (no second ``approval/asked``: the
pair stays one asked, one decided). The request is in the lane's ``approvals`` at once, but
nobody can be attached yet (the daemon opens such sessions before it accepts connections),
so the "no answerer" rule waits ``reask_grace_seconds`` for one to attach: within the grace
an answerer that comes and goes does not end the wait; at its end, no answerer → unavailable;
from then on the rules above hold. An ``allowed-once`` returns once, and the caller's
pipeline runs the command once (the barrier makes the grant durable first). A daemon stop
that *detaches* (``on_stop = "detach"``) calls :meth:`ApprovalDesk.detach` first: a request
cancelled from then on is hidden but not decided, so its ``approval/asked`` stays open in the
log for the next start to ask again.

Cancellation is the call's: the gate waits in the call's cancel scope (``dshd.sessions.calls``),
and a cancel while it waits is recorded as ``cancelled`` by ``caller`` before the cancellation
goes on (the call settles ``APPROVAL_CANCELLED``). The desk reaches its session only through
:class:`ApprovalPort` (record an event, the policy, show and hide a request on the lane), so it
is driven by a fake port in the tests.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Protocol

import trio

from protocol.lane import ApprovalRequest

from .. import errors
from ..results import CallFailed, sentence
from ..storage.errors import StorageError

#: Decided approvals whose outcome a session keeps in memory (a late answer's -32011), at most.
DECIDED_MAX = 1024
#: why -> (errorCode, variant of ``dshd.results.SENTENCES``) of an outcome that does not run.
WHY = {
    "rejected-policy": ("APPROVAL_REJECTED", "policy"),
    "rejected-answerer": ("APPROVAL_REJECTED", "answerer"),
    "audit": ("APPROVAL_REJECTED", "audit"),
    "unavailable": ("APPROVAL_UNAVAILABLE", ""),
    "unavailable-left": ("APPROVAL_UNAVAILABLE", "left"),
    "unavailable-grace": ("APPROVAL_UNAVAILABLE", "grace"),
    "cancelled": ("APPROVAL_CANCELLED", ""),
}


def refused(why: str) -> CallFailed:
    """The ``CallFailed`` of an outcome that does not run (``why`` a key of :data:`WHY`)."""
    code, variant = WHY[why]
    return CallFailed(code, sentence(code, variant))


class ApprovalPort(Protocol):
    """What the desk needs of its session."""

    @property
    def policy(self) -> str: ...

    def record(self, type_: str, data: dict) -> int:
        """Append an event to the session log; its seq. Raises when it cannot."""
        ...

    async def wait_durable(self, seq: int) -> None:
        """Return once the log is durable through ``seq``; StorageError when it cannot be."""
        ...

    def show_approval(self, approval_id: str, request: ApprovalRequest) -> None: ...

    def hide_approval(self, approval_id: str) -> None: ...


class GateCall(Protocol):
    """What the gate reads of a call."""

    call_id: str
    name: str
    arguments: dict
    approved: bool


@dataclass
class _Pending:
    approval_id: str
    call_id: str
    decided: trio.Event = field(default_factory=trio.Event)
    outcome: str | None = None
    by: str | None = None
    why: str | None = None
    #: A re-ask's grace (trio time) before which the "no answerer" rule does not apply.
    grace_until: float = 0.0


def summary_of(call: GateCall) -> str:
    """The exact command a person is asked about (never a truncated label)."""
    if call.name == "bash":
        return str(call.arguments.get("command", ""))
    return f"{call.name} {call.arguments}"


class ApprovalDesk:
    """One per session: pending requests, answerer count, decisions (see module doc)."""

    def __init__(self, port: ApprovalPort, session_id: str) -> None:
        self.port = port
        self.session_id = session_id
        self.answerers: set[str] = set()
        self.pending: dict[str, _Pending] = {}
        #: Outcomes of the last DECIDED_MAX decided approvals (from the snapshot, the log's
        #: tail and this run; oldest out first): -32011 answers. An older one is -32007.
        self.decided: dict[str, str] = {}
        #: The daemon stops with ``on_stop = "detach"``: a pending approval stays undecided in
        #: the log (no ``cancelled`` decision), to be asked again after the start (HOST.md §7).
        self.detached = False

    # ------------------------------------------------------------------ answerers
    def answerer_joined(self, subscription_id: str) -> None:
        self.answerers.add(subscription_id)

    def answerer_left(self, subscription_id: str) -> None:
        self.answerers.discard(subscription_id)
        if not self.answerers and not self.detached:
            now = trio.current_time()
            for p in list(self.pending.values()):
                if p.grace_until <= now:  # a re-ask in its grace waits for the next one
                    self._decide(p, "unavailable", "policy", "unavailable-left")

    def detach(self) -> None:
        """The daemon stops and detaches (``CallTable.stop``): from now on a cancelled request
        records nothing (it is asked again after the start); answerers leaving decide nothing."""
        self.detached = True

    # ------------------------------------------------------------------ deciding
    def _decide(self, p: _Pending, outcome: str, by: str, why: str | None = None) -> None:
        if p.outcome is None:
            p.outcome, p.by, p.why = outcome, by, why
            p.decided.set()

    def decide(self, approval_id: str, decision: str) -> str:
        """Apply a person's decision (``allow`` | ``reject``); returns the outcome.

        Raises ``errors.AlreadyDecided`` (-32011, ``data.outcome``) or
        ``errors.ApprovalNotFound`` (-32007).
        """
        p = self.pending.get(approval_id)
        if p is None or p.outcome is not None:
            outcome = p.outcome if p is not None else self.decided.get(approval_id)
            if outcome is not None:
                raise errors.AlreadyDecided(
                    f"approval {approval_id} was already decided: {outcome}", {"outcome": outcome})
            raise errors.ApprovalNotFound(
                f"approval {approval_id} not found in session {self.session_id}")
        outcome = "allowed-once" if decision == "allow" else "rejected"
        self._decide(p, outcome, "answerer", "rejected-answerer" if outcome == "rejected" else None)
        return outcome

    def absorb(self, type_: str, data: dict) -> None:
        """Fold a logged approval event into ``decided`` (on open)."""
        if type_ == "approval/decided":
            self.remember(data["approvalId"], data["outcome"])

    def remember(self, approval_id: str, outcome: str) -> None:
        """``approval_id`` was decided ``outcome``; at most DECIDED_MAX are kept."""
        self.decided.pop(approval_id, None)
        self.decided[approval_id] = outcome
        while len(self.decided) > DECIDED_MAX:
            del self.decided[next(iter(self.decided))]

    # ------------------------------------------------------------------ the gate
    async def gate(self, call: GateCall) -> None:
        """Return on ``allowed-once``; raise CallFailed otherwise (module doc)."""
        approval_id = "a-" + secrets.token_hex(6)
        summary = summary_of(call)
        try:
            asked_seq = self.port.record(
                "approval/asked",
                {"approvalId": approval_id, "callId": call.call_id, "tool": call.name,
                 "summary": summary},
            )
        except Exception:
            raise refused("audit") from None
        p = _Pending(approval_id, call.call_id)
        if call.approved:
            self._decide(p, "allowed-once", "caller")
        elif self.port.policy == "never":
            self._decide(p, "rejected", "policy", "rejected-policy")
        elif not self.answerers:
            self._decide(p, "unavailable", "policy", "unavailable")
        else:
            await self._ask(p, ApprovalRequest(call.call_id, call.name, summary,
                                               time.time_ns() // 1_000_000), asked_seq)
        self._conclude(p)

    async def reask(self, call: GateCall, approval_id: str, *, grace: float) -> None:
        """Ask ``approval_id`` again after a restart (module doc: re-ask); ``grace`` seconds
        for an answerer to attach. Returns on ``allowed-once``; raises CallFailed otherwise."""
        p = _Pending(approval_id, call.call_id)
        if call.approved:
            self._decide(p, "allowed-once", "caller")
        elif self.port.policy == "never":
            self._decide(p, "rejected", "policy", "rejected-policy")
        else:
            p.grace_until = trio.current_time() + grace
            request = ApprovalRequest(call.call_id, call.name, summary_of(call),
                                      time.time_ns() // 1_000_000)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._grace, p)
                await self._ask(p, request)
                nursery.cancel_scope.cancel()
        self._conclude(p)

    def _conclude(self, p: _Pending) -> None:
        """Record the decision; return on ``allowed-once``, else raise its CallFailed (an
        audit that cannot be recorded rejects: there is no unrecorded grant)."""
        assert p.outcome is not None and p.by is not None
        if not self._record(p):
            raise refused("audit")
        if p.outcome != "allowed-once":
            raise refused(p.why or p.outcome)

    async def _grace(self, p: _Pending) -> None:
        """At the end of a re-ask's grace, no answerer attached → unavailable."""
        await trio.sleep_until(p.grace_until)
        if not self.answerers:
            self._decide(p, "unavailable", "policy", "unavailable-grace")

    async def _ask(self, p: _Pending, request: ApprovalRequest,
                   asked_seq: int | None = None) -> None:
        """Make the ask durable (``asked_seq``: its ``approval/asked``; a re-ask's already is),
        show the request and wait for its decision; a cancel (of the call's scope) while
        waiting is recorded as ``cancelled`` and goes on."""
        self.pending[p.approval_id] = p
        try:
            if asked_seq is not None:
                try:
                    await self.port.wait_durable(asked_seq)
                except StorageError:
                    self._decide(p, "rejected", "policy", "audit")
            if p.outcome is None:
                self.port.show_approval(p.approval_id, request)
                await p.decided.wait()
        finally:
            self.pending.pop(p.approval_id, None)
            self.port.hide_approval(p.approval_id)
            if p.outcome is None and not self.detached:  # cancelled while it waited
                self._decide(p, "cancelled", "caller", "cancelled")
                self._record(p)

    def _record(self, p: _Pending) -> bool:
        """Append ``approval/decided``; False when the append failed (then nothing runs)."""
        self.remember(p.approval_id, p.outcome)  # type: ignore[arg-type]
        try:
            self.port.record(
                "approval/decided", {"approvalId": p.approval_id, "outcome": p.outcome, "by": p.by}
            )
        except Exception:
            return False
        return True
