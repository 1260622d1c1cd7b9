"""One open session: its event log (the truth), its lane view, its running tool calls.

Theory of operation:

* A session is opened for write exactly once per daemon (``SessionRegistry``) and then owned by
  :meth:`Session.run`, a task in the registry's nursery. That task owns the log writer's
  coalescing task, the lane publisher, and a nursery for tool calls. Tool calls therefore
  live as long as the session, never as long as the connection that asked for them: a client
  that disconnects never stops a tool.
* The log (``dshd.storage.SessionLog``) is the truth; everything in memory here is derived from
  it and rebuilt on open (policy, sandbox mode, settled results, the lane's ``recent``).
* One tool call follows EXEC.md §1: ``tool/call`` appended → gate (``dshd.approval``) →
  checkpoint barrier (the log is durable through ``tool/call``) → spawn with output captured at
  the source → ``tool/result`` appended and made durable → the call leaves the lane's ``tools``
  and enters ``recent``. Every early exit still appends a ``tool/result`` with an ``errorCode``
  and a sentence a person can act on (``dshd.results``: the one table of sentences; every
  result has ``details.truncation``, zeros for a call that never ran).
* Admission (:meth:`Session.start_call`): at most ``max_calls_per_session`` running calls per
  session and ``max_calls`` over the daemon (the registry counts); past either, ``CallLimit``
  and nothing is recorded. A call enters the lane in its first true state --
  ``waiting-approval`` when the gate will ask, ``running`` when the caller pre-approved it --
  and keeps the ``startedAt`` of its admission. The lane's ``args`` carry at most
  ``LANE_ARGS_BYTES`` of the arguments' JSON (``argsCut: true`` marks a cut); the log's
  ``tool/call`` keeps them whole. A call refused before its ``tool/call`` (a model's unknown
  tool or invalid arguments) is settled by :meth:`Session.refuse_call`: waitable at once, in
  ``recent``.
* Settings (approval policy, sandbox mode, env, owner) change in memory and on the lane only
  after their event is durable. When it cannot be made durable the change is taken back in the
  log (`SessionLog.retract` while it is the unwritten tail, else an event restoring the old
  value goes into the same buffered batch) and the caller gets the storage error: a failed
  durable change changes nothing.
* **Supervision.** Every task of the session (log writer, publisher, tool calls, turns,
  checkpoints) runs under :meth:`_guard`. The first exception that escapes one of them is a
  *crash*: it is logged once (``session.crashed``), the session's nursery is cancelled, and the
  session winds down honestly instead of wedging: a call whose command was running had its
  process group killed by the cancellation and settles ``TOOL_CANCELLED``, a call that had not
  started settles ``ABORTED_BEFORE_DISPATCH`` (each with a sentence saying the session
  crashed); a call no task could settle gets ``TOOL_OUTCOME_UNKNOWN`` (when it may have run)
  or ``ABORTED_BEFORE_DISPATCH``. Results are appended and flushed, the log is closed, which
  releases its lock and the registry's claim, and every waiter is woken (``tool.wait`` returns
  the result, or a storage error when it could not be made durable). The lane of a crashed
  session is not published again (its tracker may hold what broke it); the registry reopens
  the session from its log on the next request that names it.
* **Test hook.** ``DSH_TEST_FAULT`` (read once, by the registry, at daemon start; inert when
  unset) injects a crash for the supervision tests: ``publish-crash:TOKEN`` raises in the
  publisher task while a running call's command contains TOKEN, ``settle-crash:TOKEN`` in the
  task of such a call while it moves its settled result onto the lane (`TestFault`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import msgspec
import structlog
import trio

from protocol.codec import Encoder
from protocol.tracker import Tracker

from .. import barrier, identity, results
from ..approval import ApprovalDesk
from ..config import Config
from ..execution.capture import OutputCapture, ShellOutputLimits, SpillSink
from ..execution.env import tool_env
from ..execution.process import BashScript, run_command
from ..execution.sandbox import SandboxUnavailable
from ..paths import is_within
from ..storage.errors import StorageError
from ..storage import threads
from ..storage.sidecar import PendingOutput
from ..storage.writer import SessionLog
from .streams import Publisher, Subscription

log = structlog.get_logger("dshd.session")

RECENT_MAX = 20
#: Most bytes of a call's arguments (their JSON) the lane carries; more is cut (``argsCut``).
LANE_ARGS_BYTES = 4096
#: Pending-output sidecar checkpoints, at most one per call per this many seconds (STORAGE §6).
CHECKPOINT_SECONDS = 1.0
_json = msgspec.json.Encoder()


def tool_base_env(config: Config, owner: int | None) -> dict[str, str]:
    """The documented minimal environment of a tool (EXEC.md §1; ``dshd.execution.env``)."""
    ident = identity.run_as_for(owner)
    uid = ident.uid if ident is not None else os.geteuid()
    return tool_env(uid, pass_env=config.pass_env, secret=(config.model.api_key_env,))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class CallLimit(Exception):
    """A call past ``max_calls_per_session`` or ``max_calls``: refused, nothing recorded."""


def lane_args(encoded: str) -> tuple[object, bool]:
    """What the lane shows of arguments whose JSON is ``encoded``: ``(value, cut)``.

    Up to ``LANE_ARGS_BYTES``: ``(None, False)``, the arguments themselves are shown. Past it
    the first ``LANE_ARGS_BYTES`` bytes of the JSON text, as a string cut at a character
    boundary, and ``cut`` True.
    """
    data = encoded.encode("utf-8")
    if len(data) <= LANE_ARGS_BYTES:
        return None, False
    return data[:LANE_ARGS_BYTES].decode("utf-8", "ignore"), True


class InjectedFault(RuntimeError):
    """The exception ``DSH_TEST_FAULT`` injects (a test hook, see the module doc)."""


@dataclass(frozen=True)
class TestFault:
    """A crash to inject for tests (``DSH_TEST_FAULT=KIND:TOKEN``); see the module doc."""

    __test__ = False  # not a pytest class
    KINDS = ("publish-crash", "settle-crash")
    kind: str
    token: str

    @classmethod
    def parse(cls, value: str | None) -> TestFault | None:
        """None for unset/empty; ValueError naming the format otherwise."""
        if not value:
            return None
        kind, sep, token = value.partition(":")
        if kind not in cls.KINDS or not sep or not token:
            raise ValueError(
                f"DSH_TEST_FAULT={value!r}: expected KIND:TOKEN with KIND one of {cls.KINDS}"
            )
        return cls(kind, token)

    def hits(self, kind: str, calls) -> bool:
        return self.kind == kind and any(
            self.token in str(call.arguments.get("command", "")) for call in calls
        )


class CallFailed(Exception):
    """A call ended before or instead of running; ``code`` is its symbolic errorCode."""

    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(sentence)
        self.code = code
        self.sentence = sentence


@dataclass
class Call:
    """A tool call of this daemon run that has not settled yet."""

    call_id: str
    name: str
    arguments: dict
    approved: bool
    seq: int  # seq of its tool/call event
    cancel: trio.Event = field(default_factory=trio.Event)
    capture: OutputCapture | None = None
    synced_version: int = -1
    synced_spill: str | None = None
    started: bool = False
    pending: PendingOutput | None = None


class Session:
    """An open, writable session. Create through ``SessionRegistry``, never directly."""

    def __init__(
        self, log_: SessionLog, session_dir: Path, config: Config, sandbox,
        running_calls: Callable[[], int] | None = None, fault: TestFault | None = None,
    ) -> None:
        self.log = log_
        self.id = log_.header.id
        self.dir = session_dir
        self.config = config
        self.sandbox = sandbox
        self.calls: dict[str, Call] = {}
        #: Running calls over the whole daemon (the registry's count; None: this session's).
        self._running_calls = running_calls or (lambda: len(self.calls))
        self.call_ids: set[str] = set()
        self.call_names: dict[str, str] = {}
        self.results: dict[str, dict] = {}
        self._result_seqs: dict[str, int] = {}  # callId -> seq of its tool/result (this run)
        self._settled: dict[str, trio.Event] = {}
        self.policy = config.approval_policy
        self.mode = config.sandbox
        self.env: dict[str, str] = {}
        #: uid that created the session (None: written before owners were recorded).
        self.owner: int | None = None
        self.approvals = ApprovalDesk(self)
        #: The agent loop (``dshd.agent.TurnDriver``), made on the first ``turn.*`` request.
        self.agent = None
        recent: list[dict] = []
        self._policy_seq = -1  # seq of the approval/policy event in force
        for ev in log_.events:
            self._absorb(ev.type, ev.data, recent)
            if ev.type == "approval/policy":
                self._policy_seq = ev.seq
        recent.reverse()
        h = log_.header
        self.tracker = Tracker(
            {
                "session": {
                    "sessionId": self.id,
                    "title": h.title,
                    "cwd": h.cwd,
                    "approvalPolicy": self.policy,
                    "sandbox": self.mode,
                },
                "tools": {},
                "approvals": {},
                "recent": recent[:RECENT_MAX],
                "turn": None,
            }
        )
        self.publisher = Publisher(
            self.tracker,
            before_flush=self._sync_captures,
            interval=config.publish_interval_seconds,
            rate=config.publish_rate_bytes,
        )
        self._calls_nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        self._publisher_task = None
        self._fault = fault
        #: The exception that crashed this session (None while it is healthy).
        self.crash: BaseException | None = None
        self._closed = trio.Event()
        self.finished = trio.Event()

    # ----------------------------------------------------------------- derived state
    def _absorb(self, type_: str, data: dict, recent: list[dict] | None = None) -> None:
        """Fold one logged event into the in-memory state (used on open)."""
        if type_ == "approval/decided":
            self.approvals.absorb(type_, data)
        elif type_ == "approval/policy":
            self.policy = data.get("policy", self.policy)
        elif type_ == "sandbox/mode":
            self.mode = data.get("mode", self.mode)
        elif type_ == "session/env":
            self.env = dict(data.get("env") or {})
        elif type_ == "session/owner":
            self.owner = data.get("uid")
        elif type_ == "tool/call":
            cid = data["callId"]
            self.call_ids.add(cid)
            self.call_names[cid] = data.get("name", "")
        elif type_ == "tool/result":
            cid = data["callId"]
            self.call_ids.add(cid)  # repair's TOOL_NOT_STARTED results have no tool/call
            self.results[cid] = data
            ev = self._settled.setdefault(cid, trio.Event())
            ev.set()
            if recent is not None:
                recent.append(self._recent_entry(cid, data))

    def _recent_entry(self, call_id: str, result: dict) -> dict:
        return {
            "callId": call_id,
            "name": self.call_names.get(call_id),
            "isError": bool(result.get("isError")),
            "exitCode": result.get("exitCode"),
            "errorCode": result.get("errorCode"),
        }

    def info(self) -> dict:
        """SessionInfo of PROTOCOL.md §3.1."""
        h = self.log.header
        return {
            "sessionId": self.id,
            "title": h.title,
            "cwd": h.cwd,
            "createdAt": h.createdAt,
            "approvalPolicy": self.policy,
            "sandbox": self.mode,
            "running": len(self.calls),
            "lastSeq": self.log.last_seq,
            "owner": self.owner,
        }

    # ----------------------------------------------------------------- the narrow port
    # What rooms outside ``dshd/sessions`` may use besides the methods below: nothing else of
    # a session (its log, tracker, publisher and private attributes stay inside).
    @property
    def last_seq(self) -> int:
        """Seq of the newest event (unflushed tail included)."""
        return self.log.last_seq

    @property
    def running(self) -> int:
        """Tool calls of this session that have not settled."""
        return len(self.calls)

    def write_started(self) -> float | None:
        """trio time the log write in flight began (None: none in flight; the watchdog)."""
        return self.log.write_started

    def has_call(self, call_id: str) -> bool:
        """The session knows ``call_id`` (a ``tool/call`` or a ``tool/result`` names it)."""
        return call_id in self.call_ids

    def decide(self, approval_id: str, decision: str) -> str:
        """Decide a pending approval (``dshd.approval``); the outcome recorded."""
        return self.approvals.decide(approval_id, decision)

    def rebase(self, sub: Subscription) -> None:
        """Send ``sub`` a base batch at the next publish (a dropped or resynced stream)."""
        self.publisher.rebase(sub)

    def events(self, after_seq: int, limit: int) -> list:
        """Events with seq > after_seq, oldest first, unflushed tail included."""
        evs = self.log.events
        start = max(after_seq + 1, 0)
        return evs[start : start + limit]

    # ----------------------------------------------------------------- lifetime
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Own the log writer, the publisher and the calls until the registry closes us or
        the session crashes (module doc: supervision). Never raises an ``Exception``."""
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                await nursery.start(self._guard, self.log.run)
                await nursery.start(self._guard, self._publish)
                async with trio.open_nursery() as calls:
                    self._calls_nursery = calls
                    task_status.started()
                    await self._closed.wait()
                    if self.agent is not None:
                        self.agent.stop()  # the running turn ends ``interrupted``
                    # Graceful stop: cancel every running call; each settles TOOL_CANCELLED.
                    for call in list(self.calls.values()):
                        call.cancel.set()
                self._calls_nursery = None
                nursery.cancel_scope.cancel()
        except Exception as exc:  # escaped the guards: the session's own code failed
            self._crashed(exc)
        finally:
            self._calls_nursery = None
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self._wind_down()
            for event in self._settled.values():
                event.set()  # nobody waits forever: wait_result says what is missing
            self.finished.set()

    async def _wind_down(self) -> None:
        """Settle what no task settled, publish the final state (healthy only), close the log."""
        for call in list(self.calls.values()):
            # Its task is gone without settling it (a crash, or it never got one).
            if call.started:
                code, sentence = "TOOL_OUTCOME_UNKNOWN", (
                    f"the session crashed ({self._crash_text()}) while the call ran and dshd "
                    "could not follow it; it may or may not have run; retry only if read-only "
                    "or idempotent, otherwise check the outside world first")
            else:
                code, sentence = "ABORTED_BEFORE_DISPATCH", (
                    f"the session crashed ({self._crash_text()}) before the call started; "
                    "nothing ran")
            try:
                await self._settle(call, self._failed_result(call, code, sentence),
                                   log.bind(session=self.id, call=call.call_id))
            except Exception as exc:
                log.error("session.settle_failed", session=self.id, call=call.call_id,
                          error=repr(exc))
        if self.crash is None:
            try:
                self.publisher.publish_now()
            except Exception as exc:
                self._crashed(exc)
        try:
            await self.log.aclose()
        except StorageError as exc:
            log.error("session.close_failed", session=self.id, error=str(exc))
        except Exception as exc:
            log.error("session.close_failed", session=self.id, error=repr(exc))

    async def _guard(self, fn, *args, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run one of the session's tasks; an exception that escapes it crashes the session
        (module doc) instead of the registry's nursery. Cancellation passes through."""
        try:
            if task_status is trio.TASK_STATUS_IGNORED:
                await fn(*args)
            else:
                await fn(*args, task_status=task_status)
        except Exception as exc:
            self._crashed(exc)
        except BaseExceptionGroup as group:  # errors mixed with Cancelled
            errors, rest = group.split(Exception)
            if errors is None:
                raise
            self._crashed(errors)
            if rest is not None:
                raise rest from None

    def _crashed(self, exc: BaseException) -> None:
        """The first crash is logged (once) and cancels the session; later ones are noted."""
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if self.crash is None:
            self.crash = exc
            log.error("session.crashed", session=self.id, error=f"{type(exc).__name__}: {exc}",
                      running=len(self.calls), exc_info=exc)
        else:
            log.warning("session.crash_followup", session=self.id, error=repr(exc))
        if self._scope is not None:
            self._scope.cancel()

    def _crash_text(self) -> str:
        exc = self.crash
        return "unknown error" if exc is None else f"{type(exc).__name__}: {exc}"

    async def _publish(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._publisher_task = trio.lowlevel.current_task()
        await self.publisher.run(task_status=task_status)

    def close(self) -> None:
        self._closed.set()

    def usable(self) -> bool:
        """Neither crashed nor closing: requests may use it (else the registry reopens it)."""
        return self.crash is None and not self._closed.is_set() and not self.finished.is_set()

    def idle(self) -> bool:
        """No running call or turn, no subscriber, no pending approval: safe to close."""
        return (not self.calls and not self.publisher.subscriptions and not self.approvals.pending
                and (self.agent is None or self.agent.turn is None))

    # ----------------------------------------------------------------- policy / mode
    async def record_settings(
        self, *, policy: str, mode: str, env: dict, source: str, owner: int | None = None
    ) -> None:
        """Record a new session's owner, policy, sandbox mode and env durably, then apply and
        show them. Raises StorageError, changing nothing (see `_record_durably`)."""
        change: list[tuple[str, dict, bool]] = []
        undo: list[tuple[str, dict, bool]] = []
        if owner is not None:
            change.append(("session/owner", {"uid": owner}, True))
            undo.append(("session/owner", {"uid": self.owner}, True))
        change.append(("approval/policy", {"policy": policy, "source": source}, False))
        undo.append(("approval/policy", {"policy": self.policy, "source": "rollback"}, False))
        change.append(("sandbox/mode", {"mode": mode, "source": source}, False))
        undo.append(("sandbox/mode", {"mode": self.mode, "source": "rollback"}, False))
        if env:
            change.append(("session/env", {"env": dict(env)}, True))
            undo.append(("session/env", {"env": dict(self.env)}, True))
        await self._record_durably(change, undo)
        if owner is not None:
            self.owner = owner
        if env:
            self.env = dict(env)
        self.policy = policy
        self.mode = mode
        self.tracker.set(["session", "approvalPolicy"], policy)
        self.tracker.set(["session", "sandbox"], mode)
        self.publisher.mark_dirty()

    async def set_policy(self, policy: str, source: str) -> None:
        """Change the approval policy once the change is durable; StorageError changes
        nothing (PROTOCOL.md: -32014 and the old policy stays)."""
        seq = await self._record_durably(
            [("approval/policy", {"policy": policy, "source": source}, False)],
            [("approval/policy", {"policy": self.policy, "source": "rollback"}, False)],
        )
        if seq < self._policy_seq:
            return  # a later change became durable with us and already applied
        self._policy_seq = seq
        self.policy = policy
        self.tracker.set(["session", "approvalPolicy"], policy)
        self.publisher.mark_dirty()

    async def _record_durably(
        self, change: list[tuple[str, dict, bool]], undo: list[tuple[str, dict, bool]]
    ) -> int:
        """Append the ``change`` events and wait (shielded: a disconnect must not leave memory
        and log apart) until they are durable; return the last seq.

        When that fails the change is taken back before StorageError reaches the caller: the
        events are retracted while they are still the unwritten tail of the log, else the
        ``undo`` events (the old values) are appended to the same buffered batch, so the retry
        that finally writes it leaves the settings as they were.
        """
        first = last = -1
        for type_, data, ignorable in change:
            last = self.log.append(type_, data, ignorable=ignorable).seq
            first = last if first < 0 else first
        try:
            with trio.CancelScope(shield=True):
                await self.log.wait_durable(last)
        except StorageError:
            if not self.log.retract(first, last):
                for type_, data, ignorable in undo:
                    self.log.append(type_, data, ignorable=ignorable)
            raise
        return last

    # ----------------------------------------------------------------- subscriptions
    def subscribe(self, sub: Subscription, *, answerer: bool = False) -> None:
        """Attach a subscription (base batch first); an answerer may decide approvals."""
        if answerer:
            self.approvals.answerer_joined(sub.id)
        self.publisher.attach(sub)

    def unsubscribe(self, sub: Subscription) -> None:
        self.publisher.detach(sub)
        self.approvals.answerer_left(sub.id)

    # ----------------------------------------------------------------- tool calls
    def start_call(
        self,
        call_id: str,
        name: str,
        arguments: dict,
        approved: bool,
        *,
        turn_id: str | None = None,
        step_id: str | None = None,
    ) -> None:
        """Append ``tool/call`` and start the call's pipeline in the session's nursery.

        The caller has checked the id is new and the tool and arguments are valid (a model's
        call too: an invalid one gets a result without a ``tool/call`` body run). ``turn_id`` /
        ``step_id`` tie a model-proposed call to its step (STORAGE.md §3). Await the outcome
        with :meth:`wait_result`. Raises ``CallLimit`` (nothing recorded) past
        ``max_calls_per_session`` or ``max_calls``.
        """
        if self._calls_nursery is None:
            raise StorageError("the session is closing; no new calls are accepted")
        self.admit_call()
        encoded = _json.encode(arguments).decode()
        data = {"callId": call_id, "name": name, "arguments": encoded}
        if turn_id is not None:
            data["turnId"] = turn_id
        if step_id is not None:
            data["stepId"] = step_id
        ev = self.log.append("tool/call", data)
        self.call_ids.add(call_id)
        self.call_names[call_id] = name
        self._settled.setdefault(call_id, trio.Event())
        call = Call(call_id, name, arguments, approved, ev.seq)
        self.calls[call_id] = call
        try:
            self._begin_call(call, encoded)
        except Exception as exc:
            # The tool/call is in the log: it gets its result now, never a phantom running
            # call. A lane that cannot be cleaned up crashes the session (rebuilt on reopen).
            self.calls.pop(call_id, None)
            try:
                if call_id in self.tracker.value["tools"]:
                    self.tracker.delete(["tools", call_id])
            except Exception as lane_exc:
                self._crashed(lane_exc)
            result = self._failed_result(call, "ABORTED_BEFORE_DISPATCH", results.sentence(
                "ABORTED_BEFORE_DISPATCH", "could-not-start", error=f"{type(exc).__name__}: {exc}"))
            self.log.append("tool/result", result)
            self.results[call_id] = result
            self._settled[call_id].set()
            raise

    def _begin_call(self, call: Call, encoded: str) -> None:
        """The call's lane entry and its task (``encoded``: the arguments' JSON, as logged)."""
        call_id, name, arguments, approved = call.call_id, call.name, call.arguments, call.approved
        limits = ShellOutputLimits(
            max_bytes=self.config.output_max_bytes, max_lines=self.config.output_max_lines
        )
        call.capture = OutputCapture(
            limits, SpillSink(self.dir / "spill" / f"{call_id}.log")
        )
        cut_args, cut = lane_args(encoded)
        entry = {
            "name": name,
            "args": cut_args if cut else arguments,
            "state": "running" if approved else "waiting-approval",
            "startedAt": now_ms(),
            "output": call.capture.tool_output(),
        }
        if cut:
            entry["argsCut"] = True
        self.tracker.set(["tools", call_id], entry)
        call.synced_version = call.capture.version
        self.publisher.mark_dirty()
        assert self._calls_nursery is not None
        self._calls_nursery.start_soon(self._guard, self._run_call, call)

    def admit_call(self) -> None:
        """Raise ``CallLimit`` when one more running call would pass a limit (module doc)."""
        here, limit = len(self.calls), self.config.max_calls_per_session
        if here >= limit:
            raise CallLimit(
                f"session {self.id} already runs {here} calls (max_calls_per_session = {limit})"
            )
        total, limit = self._running_calls(), self.config.max_calls
        if total >= limit:
            raise CallLimit(f"dshd already runs {total} calls over all sessions "
                            f"(max_calls = {limit})")

    def refuse_call(self, call_id: str, name: str, code: str, text: str) -> dict:
        """Settle a call refused before its ``tool/call`` (a model's): its ``tool/result`` is
        appended, it enters ``recent``, and ``wait_result`` answers it at once (once durable)."""
        result = results.failed(call_id, code, text, self._zero_truncation())
        ev = self.log.append("tool/result", result)
        self.call_ids.add(call_id)
        self.call_names[call_id] = name
        self.results[call_id] = result
        self._result_seqs[call_id] = ev.seq  # wait_result makes it durable before answering
        self._settled.setdefault(call_id, trio.Event()).set()
        self._enter_recent(call_id, result)
        return result

    def _zero_truncation(self) -> dict:
        return results.zero_truncation(self.config.output_max_bytes, self.config.output_max_lines)

    def _enter_recent(self, call_id: str, result: dict) -> None:
        self.tracker.insert(["recent"], 0, self._recent_entry(call_id, result))
        excess = len(self.tracker.value["recent"]) - RECENT_MAX
        if excess > 0:
            self.tracker.splice(["recent"], RECENT_MAX, excess, [])
        self.publisher.mark_dirty()

    async def _run_call(self, call: Call) -> None:
        slog = log.bind(session=self.id, call=call.call_id)
        result: dict
        try:
            try:
                await self.approvals.gate(call)
                await barrier.checkpoint(
                    self.log, self.log.last_seq, kind="tool/dispatch", cancel=call.cancel
                )
                result = await self._execute(call)
            except (CallFailed, barrier.BarrierFailed) as failed:
                result = self._failed_result(call, failed.code, failed.sentence)
            except Exception as exc:
                # A bug or an unexpected OS error in one call must not take the daemon down:
                # the call settles as failed, with the reason, and everything else goes on.
                slog.exception("tool.internal_error")
                while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                    exc = exc.exceptions[0]  # say what happened, not "exceptions from a nursery"
                result = self._failed_result(call, "TOOL_FAILED", results.sentence(
                    "TOOL_FAILED", "internal", error=f"{type(exc).__name__}: {exc}"))
        except BaseException:
            # Shutdown or a crash of the session cancelled us mid-call (run_command killed the
            # process group on the way out): settle as cancelled, shielded and bounded.
            code = "TOOL_CANCELLED" if call.started else "ABORTED_BEFORE_DISPATCH"
            if self.crash is not None:
                sentence = results.sentence(
                    code, "crashed" if call.started else "crashed-before",
                    error=f"{self._crash_text()}; see the daemon log")
            else:
                sentence = results.sentence(code, "stopped" if call.started else "stopping")
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._settle(call, self._failed_result(call, code, sentence), slog)
            raise
        await self._settle(call, result, slog)

    async def _execute(self, call: Call) -> dict:
        args = call.arguments
        cwd = self.log.header.cwd
        if is_within(cwd, self.config.state_path()):
            raise CallFailed(
                "SANDBOX_UNAVAILABLE", results.sentence("SANDBOX_UNAVAILABLE", "state-dir", cwd=cwd)
            )
        # The session env and the call's ids are set inside the sandbox (by env(1)), so that
        # nothing in them (LD_PRELOAD, say) reaches the sandbox wrapper itself.
        inner_env = dict(self.env)
        inner_env["DSH_CALL_ID"] = call.call_id
        inner_env["DSH_SESSION_ID"] = self.id
        inner = ["env", "--", *(f"{k}={v}" for k, v in inner_env.items())]
        script = BashScript(args["command"])  # run_command closes it
        fds: list[int] = []  # the sandbox's pinned workspace and lease; run_command closes them
        try:
            argv, completeness = self.sandbox.confine(
                inner + script.argv,
                self.mode,
                cwd,
                hide=[str(self.config.state_path()), str(self.config.socket_path())],
                network=self.config.network,
                fds=fds,
            )
        except SandboxUnavailable as exc:
            script.close()
            raise CallFailed("SANDBOX_UNAVAILABLE",
                             results.sentence("SANDBOX_UNAVAILABLE", reason=exc)) from None
        env = tool_base_env(self.config, self.owner)
        call.started = True
        if self.tracker.value["tools"][call.call_id]["state"] != "running":
            self.tracker.set(["tools", call.call_id, "state"], "running")
            self.publisher.mark_dirty()
        timeout = args.get("timeout")
        call.pending = PendingOutput(self.dir, call.call_id)
        with barrier.passed("tool/dispatch"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._checkpoint_output, call)
                outcome = await run_command(
                    argv,
                    cwd=cwd,
                    env=env,
                    capture=call.capture,
                    on_output=self.publisher.mark_dirty,
                    timeout=float(timeout) if timeout is not None else None,
                    cancel=call.cancel,
                    kill_grace=self.config.kill_grace_seconds,
                    eof_grace=self.config.eof_grace_seconds,
                    as_user=identity.run_as_for(self.owner),
                    script=script,
                    pass_fds=fds,
                    spare_wrapper=(getattr(self.sandbox, "wrapper_comm", None)
                                   if completeness != "none" else None),
                )
                nursery.cancel_scope.cancel()
        cap = call.capture
        details: dict = {"truncation": dict(cap.truncation)}
        if cap.spill_path:
            details["spillPath"] = cap.spill_path
        if outcome.exit_code is not None:
            details["exitCode"] = outcome.exit_code
        content = cap.text
        result = {
            "callId": call.call_id,
            "isError": bool(outcome.exit_code != 0 or outcome.error or outcome.timed_out
                            or outcome.cancelled),
            "content": content,
            "details": details,
        }
        if completeness != "full":
            details["sandbox"] = {"provider": self.sandbox.name, "completeness": completeness}
        if outcome.exit_code is not None:
            result["exitCode"] = outcome.exit_code
        if outcome.timed_out:
            result["errorCode"] = "TOOL_TIMEOUT"
            result["message"] = results.sentence("TOOL_TIMEOUT", timeout=args.get("timeout"))
        elif outcome.cancelled:
            result["errorCode"] = "TOOL_CANCELLED"
            result["message"] = results.sentence(
                "TOOL_CANCELLED", "shutdown" if self._closed.is_set() else "")
        elif outcome.error:
            result["errorCode"] = "TOOL_FAILED"
            result["message"] = results.sentence("TOOL_FAILED", error=outcome.error)
        return result

    def _failed_result(self, call: Call, code: str, sentence: str) -> dict:
        cap = call.capture
        if call.started and cap is not None:
            return results.failed(call.call_id, code, sentence, cap.truncation,
                                  output=cap.text, spill_path=cap.spill_path)
        return results.failed(call.call_id, code, sentence, self._zero_truncation())

    async def _settle(self, call: Call, result: dict, slog) -> None:
        """Append ``tool/result``, make it durable, move the call from tools to recent."""
        if call.call_id in self.results:
            return  # settled already (a crash winding down after the call's own settle)
        ev = self.log.append("tool/result", result)
        self.results[call.call_id] = result
        self._result_seqs[call.call_id] = ev.seq
        if self.crash is None:
            try:
                # Still in self.calls: the publish in _lane_settle pulls its final output first.
                self._lane_settle(call, result)
            except Exception as exc:  # the lane broke: the result still settles below
                self._crashed(exc)
        self.calls.pop(call.call_id, None)
        durable = True
        try:
            await self.log.wait_durable(ev.seq)
        except StorageError as exc:
            durable = False
            slog.error("tool.result_not_durable", error=str(exc))
        if durable and call.pending is not None:
            try:
                await threads.run_sync(call.pending.retire)
            except OSError as exc:  # retried when the session is next opened
                slog.warning("sidecar.retire_failed", error=str(exc))
        self._settled[call.call_id].set()
        slog.info(
            "tool.settled",
            exit_code=result.get("exitCode"),
            error_code=result.get("errorCode"),
            durable=durable,
            total_bytes=(result.get("details") or {}).get("truncation", {}).get("totalBytes"),
        )

    def _lane_settle(self, call: Call, result: dict) -> None:
        """Move a settled call from ``tools`` to ``recent`` on the lane."""
        if self._fault is not None and self._fault.hits("settle-crash", [call]):
            raise InjectedFault("injected test fault (DSH_TEST_FAULT=settle-crash)")
        # The final output state is always published before the call leaves the lane.
        self.publisher.publish_now()
        self.tracker.delete(["tools", call.call_id])
        for approval_id, entry in list(self.tracker.value["approvals"].items()):
            if entry.get("callId") == call.call_id:
                self.tracker.delete(["approvals", approval_id])
        self._enter_recent(call.call_id, result)

    async def wait_result(self, call_id: str, timeout: float | None) -> dict | None:
        """The call's result once durable; None on timeout. KeyError for an unknown call."""
        if call_id not in self.call_ids:
            raise KeyError(call_id)
        ev = self._settled.setdefault(call_id, trio.Event())
        with trio.move_on_after(math.inf if timeout is None else timeout):
            if not ev.is_set():  # a settled, durable call answers even at timeout 0 (a poll)
                await ev.wait()
            if call_id not in self.results:  # woken by the end of a crashed session
                raise StorageError(
                    f"session {self.id} stopped ({self._crash_text()}) before the result of "
                    f"call {call_id} was recorded; ask again: the session reopens from its log, "
                    "which says what happened"
                )
            seq = self._result_seqs.get(call_id, -1)
            if seq > self.log.durable_seq:
                # Never claim a result that is not durable: retry the flush (StorageError
                # reaches the client as -32014) before answering.
                if self.finished.is_set():
                    raise StorageError(
                        f"session {self.id} stopped before the result of call {call_id} was "
                        "made durable; ask again: the session reopens from its log, which says "
                        "what happened"
                    )
                await self.log.wait_durable(seq)
            return self.results[call_id]
        return None

    def cancel_call(self, call_id: str) -> bool:
        if call_id not in self.call_ids:
            raise KeyError(call_id)
        call = self.calls.get(call_id)
        if call is None:
            return False
        call.cancel.set()
        return True

    async def _checkpoint_output(self, call: Call) -> None:
        """Checkpoint the call's ToolOutput to its sidecar at most once a second (STORAGE §6).

        Own tracker and encoder; a base batch first, after a failure, and whenever the
        sidecar asks for one (every 50 checkpoints), so recovery replays at most 50.
        """
        cap, pending = call.capture, call.pending
        assert cap is not None and pending is not None
        tracker = Tracker(cap.tool_output())
        encoder = Encoder()
        last_version = -1
        while True:
            await trio.sleep(CHECKPOINT_SECONDS)
            if cap.version == last_version:
                continue
            last_version = cap.version
            tracker.set_text(["content", 0, "text"], cap.text)
            tracker.set(["truncation"], dict(cap.truncation))
            if cap.spill_path:
                tracker.set(["details", "spillPath"], cap.spill_path)
            if pending.needs_base:
                tracker.rebase()
            ops = tracker.flush()
            if not ops:
                continue
            try:
                await pending.checkpoint(encoder.encode(ops), base=ops[0][0] == "r")
            except StorageError as exc:
                log.warning("sidecar.checkpoint_failed", session=self.id, call=call.call_id,
                            error=str(exc))
                encoder = Encoder()
                tracker.rebase()

    # ----------------------------------------------------------------- lane sync
    def _sync_captures(self) -> None:
        """Pull changed capture state into the lane tracker (called by the publisher)."""
        if (self._fault is not None and self._publisher_task is not None
                and trio.lowlevel.current_task() is self._publisher_task
                and self._fault.hits("publish-crash", self.calls.values())):
            raise InjectedFault("injected test fault (DSH_TEST_FAULT=publish-crash)")
        for call in self.calls.values():
            cap = call.capture
            if cap is None or cap.version == call.synced_version:
                continue
            base = ["tools", call.call_id, "output"]
            self.tracker.set_text(base + ["content", 0, "text"], cap.text)
            self.tracker.set(base + ["truncation"], dict(cap.truncation))
            if cap.spill_path and call.synced_spill != cap.spill_path:
                self.tracker.set(base + ["details", "spillPath"], cap.spill_path)
                call.synced_spill = cap.spill_path
            call.synced_version = cap.version
