"""One open session: its event log (the truth), its settings, its subscribers, the port.

Theory of operation:

* A session is opened for write exactly once per daemon (``SessionRegistry``) and then owned by
  :meth:`Session.run`, a task in the registry's nursery. That task owns the log writer's
  coalescing task, the lane publisher, and a nursery for the session's work (tool calls and
  turns, started through :meth:`spawn`). Work therefore lives as long as the session, never as
  long as the connection that asked for it: a client that disconnects never stops a tool.
* The log (``dshd.storage.SessionLog``) is the truth; everything in memory is derived from it
  and rebuilt on open from the last ``log/snapshot``'s ``session`` dict (:meth:`snapshot_state`
  gives it to the writer) and the events after it (policy, sandbox mode, env, owner, the known
  call ids, the lane's ``recent``). Memory is bounded whatever the session's length: the
  writer's tail, the unsettled calls, the pending approvals, ``RECENT_MAX`` recent calls, an
  LRU of ``results_cache`` settled results and the compact call index
  (``dshd.sessions.call_index``, read on open from the snapshot chain: ``chain``); older
  events, results and the model's history are read back from disk and verified
  (``logview``; damage marks it ``damaged``). The jobs are split: ``calls`` (admission, gate → barrier → exec → settle, the
  results), ``lane`` (the lane view), ``approval`` (the gate), ``barrier``, ``streams`` (the
  publisher and subscriptions). This module keeps the lifetime, the settings, the
  subscriptions and **the port**: the methods other rooms use (handlers, the service
  watchdog, the agent loop through ``dshd.agent.port.SessionPort``); nothing outside
  ``dshd/sessions`` touches a session's log, lane, publisher or private attributes.
* Settings (approval policy, sandbox mode, env, owner, name) change in memory and on the lane
  only after their event is durable; a change that cannot be made durable is taken back and
  changes nothing (``dshd.sessions.settings``, whose ``SessionSettings`` this class is).
* **Stop.** :meth:`close` (the registry: idle, evicted, daemon stop with the caller's
  deadline and policy) ends the running turn (``interrupted``; with ``"detach"`` a turn that
  waits for its tool calls stays open instead, to resume after the start), refuses new work
  (``errors.SessionClosing``) and applies the stop policy to the running calls: ``"cancel"``
  (each settles ``TOOL_CANCELLED`` / ``APPROVAL_CANCELLED`` / ``ABORTED_BEFORE_DISPATCH``) or,
  for a daemon stop with ``on_stop = "detach"``, ``"detach"`` (running commands and pending
  approvals are left for the next daemon, HOST.md §7). Everything ends by the deadline the
  caller gave, else ``WIND_DOWN_SECONDS`` after the close: work still running near it (a
  command that ignores SIGTERM under a long ``kill_grace``) is cancelled, its command
  SIGKILLed at once, leaving the last part (``_work_deadline``) for the wind-down (settle what
  no task settled, publish, close the log).
* **Resume.** A session opened after a daemon restart gets the registry's resume plan
  (``dshd.sessions.resume``): before it serves anything, its calls that outlived the daemon
  are rebuilt and run on (:meth:`_resume`; re-adopted, settled from an exit record, or asked
  again) and its resumable turns continue (``dshd.agent.resume.resume_turn``).
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
  session is not published again (its tracker may hold what broke it), and no ``log/snapshot``
  is written after a crash (its ``recent`` never took the wind-down's settles); the registry
  reopens the session from its log on the next request that names it.
* **Test hook.** ``DSH_TEST_FAULT`` (``dshd.sessions.faults``) injects a crash for the
  supervision tests.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Awaitable, Callable

import structlog
import trio

from protocol.lane import ApprovalRequest, LaneSession

from .. import errors
from ..config import Config
from ..storage.errors import StorageError
from ..storage.writer import SessionLog
from .approval import ApprovalDesk
from . import resumed
from .call import AgentSlot, CallOutput
from .call_index import CallIndex
from .calls import CallTable, StopPolicy
from .resume import ResumePlan
from .faults import TestFault
from .lane import RECENT_MAX, Lane, TurnLane
from .logview import HISTORY_TYPES, LogView, absorb, snapshot_state
from .settings import SessionSettings
from .streams import Subscription

log = structlog.get_logger("dshd.session")

#: Seconds a wind-down may take when no caller gave a deadline (an idle close, a crash).
WIND_DOWN_SECONDS = 10.0
#: Of the time a close leaves, the part kept for settling and flushing after the work that
#: still runs is cancelled (``_work_deadline``): this share, at most this many seconds.
SETTLE_SHARE = 0.25
SETTLE_RESERVE_SECONDS = 2.0


class Session(SessionSettings):
    """An open, writable session. Create through ``SessionRegistry``, never directly."""

    def __init__(
        self, log_: SessionLog, session_dir: Path, config: Config, sandbox,
        running_calls: Callable[[], int] | None = None, fault: TestFault | None = None,
        plan: ResumePlan | None = None, index: CallIndex | None = None,
        written: Callable[[int], None] | None = None,
    ) -> None:
        self._log = log_
        #: What comes back after a daemon restart (``dshd.sessions.resume``), once it runs.
        self._plan = plan
        self.id = log_.header.id
        self.config = config
        self.policy = config.approval_policy
        self.mode = config.sandbox
        self.env: dict[str, str] = {}
        #: uid that created the session (None: written before owners were recorded).
        self.owner: int | None = None
        #: The name a person gave it (``session/name``; None: none).
        self.name: str | None = None
        self._approvals = ApprovalDesk(self, self.id)
        #: Reads of the log's old frames (``dshd.sessions.logview``); ``damaged`` lives there.
        self._view = LogView(log_, self.id)
        self._calls = CallTable(self, log_, self._approvals, config, sandbox, session_dir,
                                running_calls=running_calls, fault=fault, written=written,
                                read_result=self._view.result)
        #: The env as logged (folded at append: the next snapshot's; ``_record_durably``).
        self._logged_env: dict[str, str] = {}
        #: The agent loop (``dshd.agent.TurnDriver``), made on the first ``turn.*`` request.
        self.agent: AgentSlot | None = None
        #: seq of the approval/policy event in force (on open: any seq of the log).
        self._policy_seq = -1
        #: seq of the sandbox/mode event in force (on open: any seq of the log).
        self._mode_seq = -1
        recent = self._absorb_log(index)
        h = log_.header
        self._lane = Lane(LaneSession(self.id, h.title, h.cwd, self.policy, self.mode,
                                     self.name), recent,
                         before_flush=self._sync_outputs,
                         interval=config.publish_interval_seconds,
                         rate=config.publish_rate_bytes)
        self._calls.bind_lane(self._lane)
        self._work: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        self._publisher_task = None
        self._stop_policy: StopPolicy = "cancel"
        self._deadline = math.inf
        #: The exception that crashed this session (None while it is healthy).
        self.crash: BaseException | None = None
        self._closed = trio.Event()
        self.finished = trio.Event()

    def _absorb_log(self, index: CallIndex | None) -> list:
        """Fold the last snapshot, ``index`` (its chain's) and the tail in; ``recent``, newest first."""
        settings = self._log.settings
        self.policy = settings.get("approvalPolicy") or self.policy
        self.mode = settings.get("sandbox") or self.mode
        self.owner = settings.get("owner")
        self.name = settings.get("name")
        self.env, recent = absorb(self._log, self._calls, self._approvals, index)
        self._logged_env = dict(self.env)
        self._log.set_snapshot_state(self.snapshot_state)
        return recent[:RECENT_MAX]

    def snapshot_state(self) -> dict:
        """The session's dict for the next ``log/snapshot`` (``SessionLog``'s callback): what
        :meth:`_absorb_log` folds on the next open, as logged through ``last_seq``; the call
        index as a delta since the last durable snapshot (``CallIndex.delta``)."""
        index = self._calls.known.index
        delta = index.delta(self._log.snapshot_seq, self._log.last_seq + 1)
        return {**snapshot_state({"env": self._logged_env}, delta,
                                 self._lane.tracker.value["recent"], self._approvals.decided,
                                 self._approvals.rules.snapshot(), index.digests_of(delta)),
                "activity": self._log.activity}

    def info(self) -> dict:
        """SessionInfo of PROTOCOL.md §3.1."""
        h, activity = self._log.header, self._log.activity
        return {
            "sessionId": self.id,
            "title": h.title,
            "cwd": h.cwd,
            "createdAt": h.createdAt,
            "approvalPolicy": self.policy,
            "sandbox": self.mode,
            "running": self.running,
            "lastSeq": self._log.last_seq,
            "owner": self.owner,
            "name": self.name,
            "updatedAt": activity["updatedAt"] or h.createdAt,
            "pendingApprovals": len(self._approvals.pending),
            "lastExit": activity["lastExit"],
            **({"damaged": self._view.damaged} if self._view.damaged else {}),
        }

    # ----------------------------------------------------------------- the port
    # What rooms outside ``dshd/sessions`` may use: these methods and ``id``, ``owner``,
    # ``policy``, ``mode``, ``config``, ``agent``, ``crash``, ``finished``, ``approvals``.
    @property
    def last_seq(self) -> int:
        """Seq of the newest event (unflushed tail included)."""
        return self._log.last_seq

    @property
    def running(self) -> int:
        """Tool calls of this session that have not settled."""
        return len(self._calls.running)

    @property
    def cwd(self) -> str:
        return self._log.header.cwd

    def write_started(self) -> float | None:
        """trio time the log write in flight began (None: none in flight; the watchdog)."""
        return self._log.write_started

    async def events(self, after_seq: int, limit: int) -> list:
        """Events with seq > after_seq, oldest first, unflushed tail included, old ones from
        disk; no ``log/snapshot`` (``LogView.events``; LogCorrupt marks the session damaged)."""
        return await self._view.events(after_seq, limit)

    async def history(self) -> list:
        """The conversation's events, oldest first, from disk and the tail (the agent's)."""
        return await self._view.history(HISTORY_TYPES)

    @property
    def damaged(self) -> str | None:  # why an old frame is damaged (found by a read), or None
        return self._view.damaged

    def record(self, type_: str, data: dict, ignorable: bool = False) -> int:
        """Append an event to the log (buffered; :meth:`wait_durable` makes it durable)."""
        return self._log.append(type_, data, ignorable=ignorable).seq

    async def wait_durable(self, seq: int) -> None:
        """Return once the log is durable through ``seq``; StorageError when it cannot be."""
        await self._log.wait_durable(seq)

    def accepting(self) -> bool:
        """New work (calls, turns) is accepted: the session runs and is not closing."""
        return self._work is not None and not self._calls.stopping

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run ``fn(*args)`` as a supervised task of the session's work nursery."""
        if self._work is None:
            raise errors.SessionClosing("the session is closing; no new work is accepted")
        self._work.start_soon(self._guard, fn, *args)

    def deadline(self) -> float:
        """The trio time the wind-down must end by: the one :meth:`close` was given, else
        (a crash, or a cancellation from outside that no close announced) ``WIND_DOWN_SECONDS``
        from the first time it is asked."""
        if self._deadline == math.inf:
            self._deadline = trio.current_time() + WIND_DOWN_SECONDS
        return self._deadline

    def _work_deadline(self) -> float:
        """When work still running at a close is cancelled: :data:`SETTLE_SHARE` of the time
        left (at most :data:`SETTLE_RESERVE_SECONDS`) before :meth:`deadline` stays for the
        wind-down to settle the cancelled calls and flush."""
        deadline = self.deadline()
        left = max(0.0, deadline - trio.current_time())
        return deadline - min(SETTLE_RESERVE_SECONDS, SETTLE_SHARE * left)

    def has_call(self, call_id: str, name: str = "", arguments: dict | None = None) -> bool:
        """The session knows ``call_id`` (a ``tool/call``, a ``tool/result`` or a model's answer
        names it); with a request's ``arguments``: CALL_ID_REUSED when another call has it."""
        if arguments is not None:
            self._calls.known.check_reuse(call_id, name, arguments)
        return self._calls.has(call_id)

    def start_call(self, call_id: str, name: str, arguments: dict, approved: bool, **how) -> None:
        """Record, start a call (``CallTable.start``'s keywords); SessionClosing, CallLimit."""
        self._calls.start(call_id, name, arguments, approved, **how)

    def propose_call(self, call_id: str, name: str) -> None:
        """A recorded model answer names ``call_id``: waitable from now on."""
        self._calls.propose(call_id, name)

    def settle_unstarted(self, call_id: str, name: str, code: str, text: str) -> dict:
        """Settle a call refused before its ``tool/call``; waitable at once."""
        return self._calls.settle_unstarted(call_id, name, code, text)

    async def wait_result(self, call_id: str, timeout: float | None) -> dict | None:
        """The call's result once durable; None on timeout. CallNotFound, StorageError."""
        return await self._calls.wait(call_id, timeout, ended=self.finished.is_set())

    def cancel_call(self, call_id: str) -> bool:
        """Cancel a running call; False when it has settled. CallNotFound."""
        return self._calls.cancel(call_id)

    def call_output(self, call_id: str) -> "CallOutput":
        """Where the raw output of a known call is (HOST.md §6, ``dshd.sessions.follow``): its
        call dir, its host handle while one runs (``Call.host``; None before its command
        started and after the call left the running table), its recorded result (None until
        it settled)."""
        call = self._calls.running.get(call_id)
        return CallOutput(self._calls.call_dir(call_id),
                          getattr(call, "host", None) if call is not None else None,
                          self._calls.known.settled_result(call_id))

    @property
    def approvals(self) -> ApprovalDesk:  # decide, rules, pending requests
        return self._approvals

    def rebase(self, sub: Subscription) -> None:
        """Send ``sub`` a base batch at the next publish (a dropped or resynced stream)."""
        self._lane.publisher.rebase(sub)

    @property
    def turn_lane(self) -> TurnLane:
        """The lane's ``turn`` value, for the agent loop (``dshd.agent.port.TurnLane``): only
        its four writers, never the lane's tracker or publisher."""
        return TurnLane(self._lane)

    # ----------------------------------------------------------------- the approval port
    def show_approval(self, approval_id: str, request: ApprovalRequest) -> None:
        self._lane.show_approval(approval_id, request)

    def hide_approval(self, approval_id: str) -> None:
        self._lane.hide_approval(approval_id)

    # ----------------------------------------------------------------- lifetime
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Own the log writer, the publisher and the work until the registry closes us or
        the session crashes (module doc: supervision). Never raises an ``Exception``."""
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                await nursery.start(self._guard, self._log.run)
                await nursery.start(self._guard, self._publish)
                async with trio.open_nursery() as work:
                    self._work = work
                    await self._resume()
                    task_status.started()
                    await self._closed.wait()
                    if self.agent is not None:
                        # the running turn ends ``interrupted`` (or, detached while it
                        # waits for tool calls, stays open to resume after the start)
                        self.agent.stop(self._stop_policy)
                    self._calls.stop(self._stop_policy)
                    # The calls end gracefully (TERM, kill_grace, KILL) while the deadline
                    # allows; what still runs near it is cancelled (its command killed at
                    # once), leaving the last part of the time to settle and flush.
                    work.cancel_scope.deadline = self._work_deadline()
                self._work = None
                nursery.cancel_scope.cancel()
        except Exception as exc:  # escaped the guards: the session's own code failed
            self.crashed(exc)
        finally:
            self._work = None
            with trio.CancelScope(shield=True), trio.move_on_at(self.deadline()):
                await self._wind_down()
            self._calls.wake_all()  # nobody waits forever: wait_result says what is missing
            self.finished.set()

    async def _wind_down(self) -> None:
        """Settle what no task settled, publish the final state (healthy only), close the log."""
        await self._calls.settle_orphans()
        if self.crash is None:
            try:
                self._lane.publish_now()
            except Exception as exc:
                self.crashed(exc)
        try:
            await self._log.aclose()
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
            self.crashed(exc)
        except BaseExceptionGroup as group:  # errors mixed with Cancelled
            errors, rest = group.split(Exception)
            if errors is None:
                raise
            self.crashed(errors)
            if rest is not None:
                raise rest from None

    def crashed(self, exc: BaseException) -> None:
        """The first crash is logged (once) and cancels the session; later ones are noted."""
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if self.crash is None:
            self.crash = exc
            self._log.set_snapshot_state(None)  # module doc: no snapshot of a crashed state
            self._deadline = min(self._deadline, trio.current_time() + WIND_DOWN_SECONDS)
            log.error("session.crashed", session=self.id, error=f"{type(exc).__name__}: {exc}",
                      running=self.running, exc_info=exc)
        else:
            log.warning("session.crash_followup", session=self.id, error=repr(exc))
        if self._scope is not None:
            self._scope.cancel()

    def crash_text(self) -> str | None:
        """The crash that ends the session ("Type: text"); None while it is healthy."""
        exc = self.crash
        return None if exc is None else f"{type(exc).__name__}: {exc}"

    async def _publish(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._publisher_task = trio.lowlevel.current_task()
        await self._lane.publisher.run(task_status=task_status)

    def _sync_outputs(self) -> None:
        """The publisher's ``before_flush``: running calls' output onto the lane."""
        self._calls.sync_outputs(
            self._publisher_task is not None
            and trio.lowlevel.current_task() is self._publisher_task)

    def close(self, deadline: float | None = None, policy: StopPolicy = "cancel") -> None:
        """Stop the session (module doc: stop); its wind-down ends by ``deadline`` (a trio
        time), else ``WIND_DOWN_SECONDS`` from now; ``policy``: what happens to its running
        calls (``detach`` only for a daemon stop). Returns at once: await ``finished``."""
        if deadline is None:
            deadline = trio.current_time() + WIND_DOWN_SECONDS
        self._deadline = min(self._deadline, deadline)
        if not self._closed.is_set():
            self._stop_policy = policy
        self._closed.set()

    async def _resume(self) -> None:
        """After a daemon restart: the resume plan's calls and turns come back (module doc)."""
        plan, self._plan = self._plan, None
        await resumed.resume(self._calls, plan, self)

    def usable(self) -> bool:
        """Neither crashed nor closing: requests may use it (else the registry reopens it)."""
        return self.crash is None and not self._closed.is_set() and not self.finished.is_set()

    def idle(self) -> bool:
        """No running call or turn, no subscriber, no pending approval: safe to close."""
        return (not self._calls.running and not self._lane.publisher.subscriptions
                and not self._approvals.pending and (self.agent is None or not self.agent.busy()))

    # ----------------------------------------------------------------- subscriptions
    def subscribe(self, sub: Subscription, *, answerer: bool = False) -> None:
        """Attach a subscription (base batch first); an answerer may decide approvals."""
        if answerer:
            self._approvals.answerer_joined(sub.id)
        self._lane.publisher.attach(sub)

    def unsubscribe(self, sub: Subscription) -> None:
        self._lane.publisher.detach(sub)
        self._approvals.answerer_left(sub.id)

    def subscriptions(self) -> list[Subscription]:  # for the registry, as are the two below
        return list(self._lane.publisher.subscriptions.values())

    def is_answerer(self, sub: Subscription) -> bool:
        return sub.id in self._approvals.answerers

    def discard_unpublished(self) -> None:
        """Drop a new session that was never published (its settings could not be recorded)."""
        self._log.discard_unpublished()
