"""The approval gate: "may this call run, this once?" (PROTOCOL.md §3.4, EXEC.md §1).

Theory of operation: every call passes :meth:`ApprovalDesk.gate` before its checkpoint
barrier, and every gated call leaves the audit pair ``approval/asked`` + ``approval/decided``
with one ``approvalId``. The decision table, first match wins:

==========================================  ===============  ==========
situation                                   outcome          by
==========================================  ===============  ==========
caller pre-approved (``approved: true``)    allowed-once     caller
session policy ``never``                    rejected         policy
a live approval rule allows the command     allowed-once     rule
no answerer attached at ask time, and no    unavailable      policy
grace (``askTimeout`` absent or 0)
no answerer for a whole grace (below)       unavailable      policy
the ask cannot be made durable              rejected         policy
an answerer decides allow / reject          allowed-once /   answerer
                                            rejected
the last answerer leaves, no grace          unavailable      policy
the call is cancelled while pending         cancelled        caller
*re-asked after a restart* (:meth:`reask`):
session policy ``never``                    rejected         policy
a live approval rule allows the command     allowed-once     rule
no answerer for a whole grace               unavailable      policy
(``reask_grace_seconds``)
an answerer decides allow / reject          allowed-once /   answerer
                                            rejected
the call is cancelled while pending         cancelled        caller
==========================================  ===============  ==========

**Rules** (``dshd.sessions.rules``): a person's ``allow-for-session`` decision makes a rule
(an exact command, or a prefix of words of one simple command: ``protocol.shellwords``); its
``approval/rule`` is made durable before the decision is taken, and the decision's
``approval/decided`` names it (``ruleId``); it records the session's sandbox mode, and
matches only while the mode is that or stricter. A call whose arguments carry a non-empty
``env`` never matches a rule (``bash -c`` reads ``BASH_ENV`` and the like: the env can run
what the command does not say) and no rule is made from it; its summary shows the env
assignments before the command (:func:`summary_of`). A later call a rule allows is decided at once,
still with its audit pair: ``approval/asked``, then ``approval/decided {outcome:
allowed-once, by: rule, ruleId}``. Policy ``never`` comes first: it rejects every call,
rules or not (the session's off switch). A rule is taken back by :meth:`revoke_rule`.

**The one rule for a request nobody is attached to answer** (PROTOCOL.md §3.4): it waits a
*grace* for an answerer -- ``askTimeout`` seconds for a ``tool.run`` (absent: 0, i.e. at
once), ``turn_ask_grace_seconds`` for a model-proposed call of a turn (its chat may die or
detach and re-join: ``dsh chat --attach``), ``reask_grace_seconds`` for one asked again
after a restart. The grace runs from the moment the request has no answerer: from the ask
when none is attached, and again from the moment the last answerer leaves (never from the
ask time then). Within the grace the request is pending and listed (``approval.list``, the
lane), any connection may decide it (``approval.decide`` needs no subscription), and an
answerer that comes and goes does not end the wait; a whole grace with no answerer →
``unavailable``. While an answerer is attached its decision is waited for, however long.
With no grace (0) the last answerer leaving → ``unavailable`` at once.

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
so the one rule above waits ``reask_grace_seconds`` for one to attach. An ``allowed-once`` returns once, and the caller's
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
import shlex
import time
from dataclasses import dataclass, field
from typing import Protocol

import trio

from protocol.lane import ApprovalRequest

from .. import errors
from ..results import CallFailed, sentence
from ..storage.errors import StorageError
from .rules import RuleBook, new_rule

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
    "unavailable-timeout": ("APPROVAL_UNAVAILABLE", "timeout"),
    "unavailable-turn": ("APPROVAL_UNAVAILABLE", "turn"),
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

    #: The session's sandbox mode now (a rule matches at its mode or a stricter one).
    mode: str

    def record(self, type_: str, data: dict, ignorable: bool = False) -> int:
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
    #: ``tool.run``'s ``askTimeout``: seconds to wait for an answerer (0: at once).
    ask_timeout: float


@dataclass
class _Pending:
    approval_id: str
    call_id: str
    #: The request as shown on the lane (None until it is shown: ``approval.list``).
    request: ApprovalRequest | None = None
    #: The rule that decided it (``by: rule``) or that its ``allow-for-session`` made.
    rule_id: str | None = None
    #: The command a rule may allow (None: none may: not bash, or a call with its own env).
    ruled: str | None = None
    decided: trio.Event = field(default_factory=trio.Event)
    outcome: str | None = None
    by: str | None = None
    why: str | None = None
    #: The request's grace, seconds (0: none): the one rule (module doc).
    grace: float = 0.0
    #: End of the current grace (trio time): no answerer by then → unavailable.
    grace_until: float = 0.0
    #: Set when the last answerer leaves: the grace task starts a new grace from then.
    orphaned: trio.Event = field(default_factory=trio.Event)


def summary_of(call: GateCall) -> str:
    """The exact command a person is asked about (never a truncated label): a bash call's
    command, after its own env's assignments shell-quoted (``BASH_ENV='$(id)' ls``), as bash
    would read them; the env is bounded like the command is (``protocol.methods``)."""
    if call.name == "bash":
        command = str(call.arguments.get("command", ""))
        env = call.arguments.get("env")
        if isinstance(env, dict) and env:
            pairs = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())
            return f"{pairs} {command}"
        return command
    return f"{call.name} {call.arguments}"


def ruled_command(call: GateCall) -> str | None:
    """The command a session's rules may allow: a bash call's, unless its arguments carry a
    non-empty ``env`` (module doc: then it is always asked); None when no rule may."""
    if call.name != "bash" or call.arguments.get("env"):
        return None
    return str(call.arguments.get("command", ""))


def _not_allowed(kind: str, rule: str, approval_id: str, command: str) -> str:
    """The BAD_RULE sentence of a rule that does not allow its approval's command."""
    def cut(text: str) -> str:
        return text if len(text) <= 200 else text[:200] + "..."
    rule, shown = cut(rule), cut(command)
    if kind == "exact":
        return (f"the exact rule {rule!r} does not allow the command of approval {approval_id} "
                f"({shown!r}): an exact rule's text must equal the command (leave the rule's "
                "command out to allow this command as given)")
    return (f"the prefix rule {rule!r} does not allow the command of approval {approval_id} "
            f"({shown!r}); a prefix rule allows one simple command only (no ;, &&, ||, |, &, $, "
            "backticks, redirections or newlines) that starts with its words: allow this "
            "command with an exact rule instead")


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
        #: The session's approval rules (``dshd.sessions.rules``).
        self.rules = RuleBook()

    # ------------------------------------------------------------------ answerers
    def answerer_joined(self, subscription_id: str) -> None:
        self.answerers.add(subscription_id)

    def answerer_left(self, subscription_id: str) -> None:
        self.answerers.discard(subscription_id)
        if not self.answerers and not self.detached:
            now = trio.current_time()
            for p in list(self.pending.values()):
                if p.grace <= 0:
                    self._decide(p, "unavailable", "policy", "unavailable-left")
                else:  # the grace runs from now (its task wakes: ``_grace``)
                    p.grace_until = max(p.grace_until, now + p.grace)
                    p.orphaned.set()

    def detach(self) -> None:
        """The daemon stops and detaches (``CallTable.stop``): from now on a cancelled request
        records nothing (it is asked again after the start); answerers leaving decide nothing."""
        self.detached = True

    # ------------------------------------------------------------------ deciding
    def _decide(self, p: _Pending, outcome: str, by: str, why: str | None = None) -> None:
        if p.outcome is None:
            p.outcome, p.by, p.why = outcome, by, why
            p.decided.set()

    def _open_request(self, approval_id: str) -> _Pending:
        """The pending request ``approval_id``; -32011 (``data.outcome``) or -32007."""
        p = self.pending.get(approval_id)
        if p is None or p.outcome is not None:
            outcome = p.outcome if p is not None else self.decided.get(approval_id)
            if outcome is not None:
                raise errors.AlreadyDecided(
                    f"approval {approval_id} was already decided: {outcome}", {"outcome": outcome})
            raise errors.ApprovalNotFound(
                f"approval {approval_id} not found in session {self.session_id}")
        return p

    def decide(self, approval_id: str, decision: str) -> str:
        """Apply a person's decision (``allow`` | ``allow-once`` | ``reject``); the outcome.

        Raises ``errors.AlreadyDecided`` (-32011, ``data.outcome``) or
        ``errors.ApprovalNotFound`` (-32007).
        """
        p = self._open_request(approval_id)
        outcome = "rejected" if decision == "reject" else "allowed-once"
        self._decide(p, outcome, "answerer", "rejected-answerer" if outcome == "rejected" else None)
        return outcome

    async def allow_for_session(self, approval_id: str, kind: str | None, command: str | None,
                                by: object) -> tuple[str, str]:
        """``allow-for-session``: make the rule (``kind`` exact | prefix over ``command``;
        none given: exact, this call's command) durable, then allow the call; ``(outcome,
        ruleId)``. The rule must allow this call's command (-32602 ``BAD_RULE``); past
        ``MAX_RULES`` -32013; a rule that cannot be made durable is taken back (a
        ``rule-revoked`` after it) and nothing is decided (StorageError)."""
        p = self._open_request(approval_id)
        if p.ruled is None:
            raise errors.InvalidParams(
                f"approval {approval_id} is not a bash call of a command alone (a call with its "
                "own env is always asked: the env may run what the command does not say); "
                "allow it once instead", field="rule", code="BAD_RULE")
        rule = new_rule(kind or "exact", p.ruled if command is None else command, by,
                        time.time_ns() // 1_000_000, self.port.mode)
        if not rule.allows(p.ruled):
            raise errors.InvalidParams(_not_allowed(rule.kind, rule.command, approval_id,
                                                    p.ruled), field="rule", code="BAD_RULE")
        self.rules.check_room()
        data = rule.event()
        seq = self.port.record("approval/rule", data, ignorable=True)
        self.rules.fold("approval/rule", data)
        await self._durable(seq, undo={"ruleId": rule.rule_id, "by": by})
        self.rules.apply(rule)
        if p.outcome is not None:  # decided meanwhile (cancelled, the answerer left)
            raise errors.AlreadyDecided(
                f"approval {approval_id} was decided while its rule was recorded: {p.outcome} "
                f"(rule {rule.rule_id} stays: revoke it if it is not wanted)",
                {"outcome": p.outcome, "ruleId": rule.rule_id})
        p.rule_id = rule.rule_id
        self._decide(p, "allowed-once", "answerer")
        return "allowed-once", rule.rule_id

    async def revoke_rule(self, rule_id: str, by: object) -> None:
        """Take a rule back: at once for the gate, then ``approval/rule-revoked`` durably
        (StorageError: it stays revoked in this daemon run; the log still has it live)."""
        if self.rules.revoke(rule_id) is None:
            raise errors.InvalidParams(
                f"rule {rule_id} is not a live rule of session {self.session_id} "
                "(`dsh policy SESSION --rules` lists them)", field="ruleId", code="RULE_NOT_FOUND")
        data = {"ruleId": rule_id, "by": by}
        seq = self.port.record("approval/rule-revoked", data, ignorable=True)
        self.rules.fold("approval/rule-revoked", data)
        await self._durable(seq)

    async def _durable(self, seq: int, undo: dict | None = None) -> None:
        """Wait until the rule event at ``seq`` (appended and folded into the rules as
        logged) is durable, shielded (memory and log must not part on a disconnect); on
        StorageError append ``approval/rule-revoked`` ``undo`` (best effort) and raise."""
        try:
            with trio.CancelScope(shield=True):
                await self.port.wait_durable(seq)
        except StorageError:
            if undo is not None:
                try:
                    self.port.record("approval/rule-revoked", undo, ignorable=True)
                    self.rules.fold("approval/rule-revoked", undo)
                except Exception:  # noqa: BLE001 - the rule was never live; nothing runs by it
                    pass
            raise

    def requests(self) -> list[tuple[str, ApprovalRequest]]:
        """The requests shown and not decided, oldest first (``approval.list``)."""
        return [(aid, p.request) for aid, p in self.pending.items()
                if p.request is not None and p.outcome is None]

    def absorb(self, type_: str, data: dict) -> None:
        """Fold a logged approval event into ``decided`` or the rules (on open)."""
        if type_ == "approval/decided":
            self.remember(data["approvalId"], data["outcome"])
        else:
            self.rules.fold(type_, data)

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
        p = _Pending(approval_id, call.call_id, ruled=ruled_command(call))
        grace = float(getattr(call, "ask_timeout", 0) or 0)
        if not self._decided_at_once(p, call, summary):
            if not self.answerers and grace <= 0:
                self._decide(p, "unavailable", "policy", "unavailable")
            else:
                await self._ask_within(p, self._request(call, summary),
                                       grace if grace > 0 else None, asked_seq,
                                       getattr(call, "ask_why", "timeout"))
        self._conclude(p)

    async def reask(self, call: GateCall, approval_id: str, *, grace: float) -> None:
        """Ask ``approval_id`` again after a restart (module doc: re-ask); ``grace`` seconds
        for an answerer to attach. Returns on ``allowed-once``; raises CallFailed otherwise."""
        p = _Pending(approval_id, call.call_id, ruled=ruled_command(call))
        summary = summary_of(call)
        if not self._decided_at_once(p, call, summary):
            await self._ask_within(p, self._request(call, summary), grace, None, "grace")
        self._conclude(p)

    def _decided_at_once(self, p: _Pending, call: GateCall, summary: str) -> bool:
        """The rows of the table decided without asking: pre-approved, ``never``, a rule."""
        if call.approved:
            self._decide(p, "allowed-once", "caller")
        elif self.port.policy == "never":
            self._decide(p, "rejected", "policy", "rejected-policy")
        elif p.ruled is not None and (rule := self.rules.match(
                call.name, p.ruled, mode=self.port.mode)) is not None:
            p.rule_id = rule.rule_id
            self._decide(p, "allowed-once", "rule")
        return p.outcome is not None

    @staticmethod
    def _request(call: GateCall, summary: str) -> ApprovalRequest:
        return ApprovalRequest(call.call_id, call.name, summary, time.time_ns() // 1_000_000)

    async def _ask_within(self, p: _Pending, request: ApprovalRequest, grace: float | None,
                          asked_seq: int | None, why: str) -> None:
        """Ask, with ``grace`` seconds (None: none) for an answerer to attach (module doc:
        the one rule); ``why``: ``timeout`` (askTimeout), ``turn`` (a turn's call) or
        ``grace`` (a re-ask)."""
        if grace is None:
            await self._ask(p, request, asked_seq)
            return
        p.grace = grace
        p.grace_until = trio.current_time() + grace
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._grace, p, "unavailable-" + why)
            await self._ask(p, request, asked_seq)
            nursery.cancel_scope.cancel()

    def _conclude(self, p: _Pending) -> None:
        """Record the decision; return on ``allowed-once``, else raise its CallFailed (an
        audit that cannot be recorded rejects: there is no unrecorded grant)."""
        assert p.outcome is not None and p.by is not None
        if not self._record(p):
            raise refused("audit")
        if p.outcome != "allowed-once":
            raise refused(p.why or p.outcome)

    async def _grace(self, p: _Pending, why: str) -> None:
        """A whole grace with no answerer → unavailable (``why``); while one is attached,
        wait for the last to leave (``answerer_left`` moves ``grace_until`` on)."""
        while p.outcome is None:
            await trio.sleep_until(p.grace_until)
            if trio.current_time() < p.grace_until:
                continue  # the last answerer left meanwhile: a new grace from then
            if not self.answerers:
                self._decide(p, "unavailable", "policy", why)
                return
            p.orphaned = trio.Event()
            await p.orphaned.wait()

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
                p.request = request
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
        data = {"approvalId": p.approval_id, "outcome": p.outcome, "by": p.by}
        if p.rule_id is not None:
            data["ruleId"] = p.rule_id
        try:
            self.port.record("approval/decided", data)
        except Exception:
            return False
        return True
