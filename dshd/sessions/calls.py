"""The tool calls of one session: admission, gate → barrier → exec → settle (EXEC.md §1).

Theory of operation:

* **A call is a handle.** :class:`Call` is the daemon's handle on a command whose owner is
  outside the daemon's own work: a call host, one detached process per call that outlives
  the daemon (HOST.md §2–§7; ``dshd.execution.hosted``), reached through ``Call.host``.
  The call's :class:`trio.CancelScope` covers the daemon-side work only: the approval gate and
  the checkpoint barrier. Ending the *command* is a request to its owner
  (:meth:`Call.cancel` at the ``exec`` stage asks it to terminate: TERM, ``kill_grace``, KILL);
  the owner answers with an outcome, which settles the call. Nothing here assumes that a call's
  life ends with the daemon's.
* **Admission** (:meth:`CallTable.start`): at most ``max_calls_per_session`` running calls per
  session and ``max_calls`` over the daemon (the registry counts); past either,
  ``errors.CallLimit`` and nothing is recorded. A session that is closing refuses with
  ``errors.SessionClosing``. A call enters the lane in its first true state --
  ``waiting-approval`` when the gate will ask, ``running`` when the caller pre-approved it --
  and keeps the ``startedAt`` of its admission. The lane's ``args`` carry at most
  ``LANE_ARGS_BYTES`` of the arguments' JSON (``argsCut: true`` marks a cut); the log's
  ``tool/call`` keeps them whole.
* **The pipeline** (:meth:`CallTable._run`): ``tool/call`` appended → gate
  (``dshd.sessions.approval``) → checkpoint barrier (the log is durable through ``tool/call``)
  → the command, its output captured at the source → ``tool/result`` appended and made durable
  → the call leaves the lane's ``tools`` and enters ``recent``. Every early exit still appends a
  ``tool/result`` with an ``errorCode`` and a sentence from ``dshd.results``; this module is
  the one place a ToolResult (``protocol.lane.ToolResult``) is built, and every result has
  ``details.truncation`` (zeros for a call that never ran).
* **Unstarted calls.** A model's call is *proposed* (:meth:`CallTable.propose`) the moment the
  turn loop records the answer that names it: ``tool.wait`` waits for it from then on. One the
  loop refuses before its ``tool/call`` (unknown tool, invalid arguments, a limit, a cancelled
  turn) is settled by :meth:`CallTable.settle_unstarted`: waitable at once, in ``recent``.
* **Cancel and stop.** :meth:`CallTable.cancel` cancels one call's scope (at the gate:
  ``APPROVAL_CANCELLED``; at the barrier: ``ABORTED_BEFORE_DISPATCH``) or asks its command's
  owner to end it (``TOOL_CANCELLED``). Stopping the session applies a stop policy to every
  running call (:meth:`CallTable.stop`): ``cancel`` (a ``session.close``, idle eviction, a
  daemon stop with ``on_stop = "cancel"``) cancels each; ``detach`` (a daemon stop with
  ``on_stop = "detach"``, HOST.md §7) lets go of each call at the gate (its ``approval/asked``
  stays undecided) or running under a host started with ``on_daemon_loss = "keep"`` (the
  connection closes, no ``terminate``): no ``tool/result``, the call's task ends, the command
  runs on; a call at the barrier is cancelled (nothing ran). A call whose task is cancelled
  from outside (a session crash) settles ``TOOL_CANCELLED`` or ``ABORTED_BEFORE_DISPATCH`` in a
  shielded, bounded scope; one no task could settle is settled by
  :meth:`CallTable.settle_orphans` during the session's wind-down.
* **The marker of an unsettled call.** The call's directory ``calls/<callId>/`` (0700) is made
  at admission, before the gate, and gets the empty file ``settled`` once its ``tool/result``
  is durable (best effort: a lost one only makes the next start open the session once). The
  daemon's start opens every session with a call dir without it (``dshd.sessions.registry``).
* **Bounded memory.** What the table knows of settled calls is their entry in the exact call
  index and, for the last ``results_cache``, their result (``dshd.sessions.call_index``);
  ``tool.wait`` on an older one reads its ``tool/result`` back from the log by its seq.
* **After a restart** the session's resume plan (``dshd.sessions.resume``) brings calls back:
  :meth:`CallTable.adopt` (a live host, or its exit record: ``dshd.sessions.resumed``) and
  :meth:`CallTable.reask` (an approval that was pending).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Awaitable, Callable, Literal

import msgspec
import structlog
import trio

from protocol.lane import RecentEntry, ToolEntry, ToolResult, plain

from .. import errors
from ..config import Config
from ..execution.capture import OutputCapture, ShellOutputLimits
from ..execution.hosted import ExecOutcome, HostHandle
from ..results import CallFailed, sentence
from ..storage import threads
from ..storage.errors import StorageError
from ..storage.sidecar import PendingOutput
from ..storage.writer import SessionLog
from . import barrier, call_results, command, resumed
from .approval import ApprovalDesk, refused
from .call import Call, CallHost, now_ms
from .call_index import KnownCalls, call_digest
from .faults import InjectedFault, TestFault
from .lane import Lane, lane_args
from .output import sync_output

log = structlog.get_logger("dshd.session")
__all__ = ["Call", "CallHost", "CallTable", "SETTLED_MARKER", "StopPolicy", "now_ms"]

#: What stopping the session does to its running calls (HOST.md §7): ``cancel`` ends them,
#: ``detach`` (a daemon stop with ``on_stop = "detach"``) lets their hosts run on.
StopPolicy = Literal["cancel", "detach"]
SETTLED_MARKER = resumed.SETTLED_MARKER
_json = msgspec.json.Encoder()


class CallTable:
    """Every call of one session: the running ones, the settled results, their waiters."""

    def __init__(self, host: CallHost, log_: SessionLog, approvals: ApprovalDesk,
                 config: Config, sandbox, session_dir: Path, *,
                 running_calls: Callable[[], int] | None = None,
                 fault: TestFault | None = None, written: Callable[[int], None] | None = None,
                 read_result: Callable[[str, int], Awaitable[dict]] | None = None) -> None:
        self.host, self.log, self.approvals = host, log_, approvals
        #: The session's lane, built from what the table absorbed on open (``bind_lane``).
        self.lane: Lane
        self.config, self.sandbox, self.dir = config, sandbox, session_dir
        self.running: dict[str, Call] = {}
        #: Running calls over the whole daemon (the registry's count; None: this session's).
        self._running_calls = running_calls or (lambda: len(self.running))
        self._written = written or (lambda _bytes: None)  # a settled call's output (retention)
        self.fault = fault
        #: Every known call id, bounded memory (``dshd.sessions.call_index``); a result that
        #: fell out of the cache is read back through ``read_result`` (the session's).
        self.known = KnownCalls(config.results_cache, read_result)
        #: The session is stopping: no new calls; a cancelled command says "shutdown".
        self.stopping = False

    def bind_lane(self, lane: Lane) -> None:
        self.lane = lane

    # ----------------------------------------------------------------- derived state
    def absorb(self, ev) -> RecentEntry | None:
        """Fold one logged call event into the table (on open: the log's tail after the last
        snapshot); a result's recent entry."""
        type_, data = ev.type, ev.data
        cid = data["callId"]  # repair's TOOL_NOT_STARTED results have no tool/call
        if type_ == "tool/call":
            self.known.called(cid, data.get("name", ""),
                              {"seq": ev.seq, "time": ev.time, "data": data})
            return None
        name = self.known.settled(cid, ev.seq, data)
        self.known.wake(cid)
        return self.recent_entry(cid, data, name)

    def recent_entry(self, call_id: str, result: dict, name: str | None = None) -> RecentEntry:
        return RecentEntry(call_id, name if name is not None else self.known.names.get(call_id),
                           bool(result.get("isError")), result.get("exitCode"),
                           result.get("errorCode"))

    def has(self, call_id: str) -> bool:
        return call_id in self.known

    @property
    def logged_calls(self) -> dict:
        """callId -> its logged ``tool/call`` event, while it has no result (resume)."""
        return self.known.logged

    # ----------------------------------------------------------------- results
    def failed_result(self, call_id: str, code: str, text: str,
                      capture: OutputCapture | None = None) -> ToolResult:
        return call_results.failed_result(self.config, call_id, code, text, capture)

    def _failed(self, call: Call, code: str, text: str) -> ToolResult:
        return self.failed_result(call.call_id, code, text,
                                  call.capture if call.started else None)

    def outcome_result(self, call: Call, outcome: ExecOutcome, completeness: str) -> ToolResult:
        """The ToolResult of a command that ran (its owner's outcome)."""
        assert call.capture is not None
        return call_results.outcome_result(call.call_id, call.arguments, call.capture, outcome,
                                           completeness, self.sandbox.name, self.stopping)

    # ----------------------------------------------------------------- admission
    def admit(self) -> None:
        """Raise ``errors.CallLimit`` when one more running call would pass a limit."""
        here, limit = len(self.running), self.config.max_calls_per_session
        if here >= limit:
            raise errors.CallLimit(
                f"session {self.host.id} already runs {here} calls (max_calls_per_session = "
                f"{limit})")
        total, limit = self._running_calls(), self.config.max_calls
        if total >= limit:
            raise errors.CallLimit(f"dshd already runs {total} calls over all sessions "
                                   f"(max_calls = {limit})")

    def start(self, call_id: str, name: str, arguments: dict, approved: bool, *,
              turn_id: str | None = None, step_id: str | None = None,
              ask_timeout: float | None = 0.0) -> None:
        """Append ``tool/call`` and start the call's pipeline as a task of the session.

        The caller has checked the id is new (or only proposed) and the tool and arguments
        are valid. ``turn_id`` / ``step_id`` tie a model-proposed call to its step (STORAGE.md
        §3). Raises ``errors.SessionClosing`` or ``errors.CallLimit``, nothing recorded.
        """
        if self.stopping or not self.host.accepting():
            raise errors.SessionClosing("the session is closing; no new calls are accepted")
        self.admit()
        encoded = _json.encode(arguments).decode()
        data = {"callId": call_id, "name": name, "arguments": encoded}
        data.update({k: v for k, v in (("turnId", turn_id), ("stepId", step_id)) if v is not None})
        ev = self.log.append("tool/call", data)
        self.known.propose(call_id, name, call_digest(name, arguments))
        why = "timeout" if turn_id is None else "turn"  # a turn's: its chat may (re)join
        grace = self.config.turn_ask_grace_seconds if ask_timeout is None else ask_timeout
        call = Call(call_id, name, arguments, approved, ev.seq, ask_timeout=grace, ask_why=why)
        self.running[call_id] = call
        try:
            self._begin(call, encoded)
        except Exception as exc:
            # The tool/call is in the log: it gets its result now, never a phantom running
            # call. A lane that cannot be cleaned up crashes the session (rebuilt on reopen).
            self.running.pop(call_id, None)
            try:
                self.lane.drop_tool(call_id)
            except Exception as lane_exc:
                self.host.crashed(lane_exc)
            result = plain(self._failed(call, "ABORTED_BEFORE_DISPATCH", sentence(
                "ABORTED_BEFORE_DISPATCH", "could-not-start", error=f"{type(exc).__name__}: {exc}")))
            # wait() makes it durable before answering (never a result that may be lost).
            self.known.settled(call_id, self.log.append("tool/result", result).seq, result)
            self.known.wake(call_id)
            self.mark_settled(call_id)  # best effort, before it is durable: it never ran
            raise

    def _begin(self, call: Call, encoded: str) -> None:
        """The call's directory (the marker of an unsettled call, HOST.md §7), its lane entry
        and its task (``encoded``: the arguments' JSON, as logged)."""
        path = self.call_dir(call.call_id)
        try:
            command.make_call_dir(path)
        except OSError as exc:  # a moved or full state directory: the call fails closed
            raise StorageError(f"could not create the call directory {path}: "
                               f"{exc.strerror or exc}") from exc
        self.enter_lane(call, encoded, "running" if call.approved else "waiting-approval",
                        now_ms())
        self.host.spawn(self._run, call)

    def enter_lane(self, call: Call, encoded: str, state: str, started_at: int) -> None:
        """A new capture for ``call`` and its entry in the lane's ``tools``."""
        limits = ShellOutputLimits(max_bytes=self.config.output_max_bytes,
                                   max_lines=self.config.output_max_lines)
        call.capture = OutputCapture(limits, self.call_dir(call.call_id) / "output.raw")
        cut_args, cut = lane_args(encoded)
        self.lane.enter_tool(call.call_id, ToolEntry(
            call.name, cut_args if cut else call.arguments, state, started_at,
            call.capture.tool_output(), args_cut=cut))
        call.synced_version = call.capture.version

    def mark_settled(self, call_id: str) -> None:
        resumed.mark_settled(self.call_dir(call_id))  # best effort (module doc)

    def call_dir(self, call_id: str) -> Path:
        """The call's directory (HOST.md §3): its log, ``host.json``, ``exit.json``."""
        return self.dir / "calls" / call_id

    def propose(self, call_id: str, name: str) -> None:
        """Make ``call_id`` known and waitable before its ``tool/call`` (a model's call)."""
        self.known.propose(call_id, name)

    def settle_unstarted(self, call_id: str, name: str, code: str, text: str) -> dict:
        """Settle a call refused before its ``tool/call`` (a model's): its ``tool/result`` is
        appended, it enters ``recent``, and ``wait`` answers it at once (once durable)."""
        result = plain(self.failed_result(call_id, code, text))
        ev = self.log.append("tool/result", result)
        self.propose(call_id, name)
        self.known.settled(call_id, ev.seq, result)  # wait makes it durable before answering
        self.known.wake(call_id)
        self.lane.enter_recent(self.recent_entry(call_id, result, name))
        return result

    # ----------------------------------------------------------------- the pipeline
    async def _run(self, call: Call,
                   pipeline: Callable[[Call], Awaitable[ToolResult | None]] | None = None
                   ) -> None:
        """Run ``call`` through ``pipeline`` (default :meth:`_pipeline`) and settle it; a call
        let go at a daemon stop (``detach``) leaves without a result."""
        slog = log.bind(session=self.host.id, call=call.call_id)
        result: ToolResult | None
        try:
            try:
                result = await (pipeline or self._pipeline)(call)
            except CallFailed as failed:
                result = self._failed(call, failed.code, failed.sentence)
            except Exception as exc:
                # A bug or an unexpected OS error in one call must not take the daemon down:
                # the call settles as failed, with the reason, and everything else goes on.
                slog.exception("tool.internal_error")
                while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                    exc = exc.exceptions[0]  # say what happened, not "exceptions from a nursery"
                result = self._failed(call, "TOOL_FAILED", sentence(
                    "TOOL_FAILED", "internal", error=f"{type(exc).__name__}: {exc}"))
        except BaseException:
            if call.detached:
                self.let_go(call, slog)
                raise
            # The session's scope was cancelled under us (a crash; run_hosted told the
            # host to kill the command on the way out): settle as cancelled, shielded and bounded.
            code = "TOOL_CANCELLED" if call.started else "ABORTED_BEFORE_DISPATCH"
            crash = self.host.crash_text()
            if crash is not None:
                text = sentence(code, "crashed" if call.started else "crashed-before",
                                error=f"{crash}; see the daemon log")
            else:
                text = sentence(code, "stopped" if call.started else "stopping")
            with trio.CancelScope(shield=True), trio.move_on_at(self.host.deadline()):
                await self._settle(call, self._failed(call, code, text), slog)
            raise
        if result is None:
            self.let_go(call, slog)
        else:
            await self._settle(call, result, slog)

    def let_go(self, call: Call, slog) -> None:
        """A call detached at a daemon stop: no result, out of the running table; its host
        runs on (or its approval stays pending) for the next daemon (HOST.md §7)."""
        self.running.pop(call.call_id, None)
        if call.pending is not None:
            call.pending.close()
        slog.info("tool.detached", stage=call.stage)

    async def _pipeline(self, call: Call, gate=None) -> ToolResult | None:
        """Gate (``gate``, default the desk's) → barrier → exec in the call's scope; a cancel
        of the scope is its result; None: the call was detached (module doc)."""
        with call.scope:
            await (gate or self.approvals.gate)(call)
            call.stage = "barrier"
            await barrier.checkpoint(self.log, self.log.last_seq, kind="tool/dispatch")
            return await self._execute(call)
        if call.detached:
            return None
        if call.stage == "gate":
            raise refused("cancelled")
        raise barrier.aborted("tool/dispatch")

    async def _execute(self, call: Call) -> ToolResult | None:
        """Hand the command to its owner (``command.run``) and build the result of its outcome."""

        def started() -> None:
            call.stage = "exec"
            self.lane.tool_running(call.call_id)

        def hosted(handle: HostHandle) -> None:
            call.host = handle

        assert call.capture is not None
        call.pending = PendingOutput(self.dir, call.call_id)
        call.keeps = self.config.on_stop == "detach"
        outcome, completeness = await command.run(
            command.CommandSpec(call.call_id, call.name, call.arguments, call.capture,
                                call.pending, call.terminate, self.call_dir(call.call_id),
                                detach=call.detach, keep=call.keeps),
            self.host, self.log.header.cwd, self.config, self.sandbox,
            on_start=started, on_output=self.lane.mark_dirty, on_host=hosted,
        )
        if outcome.detached:
            return None
        return self.outcome_result(call, outcome, completeness)

    # ----------------------------------------------------------------- settling
    async def _settle(self, call: Call, result_: ToolResult, slog) -> None:
        """Append ``tool/result``, make it durable, move the call from tools to recent."""
        if self.known.is_settled(call.call_id):
            return  # settled already (a crash winding down after the call's own settle)
        result = plain(result_)
        ev = self.log.append("tool/result", result)
        self.known.settled(call.call_id, ev.seq, result)
        if self.host.crash_text() is None:
            try:
                # Still running: settle_tool publishes its final output first.
                if self.fault is not None and self.fault.hits("settle-crash", [call]):
                    raise InjectedFault("injected test fault (DSH_TEST_FAULT=settle-crash)")
                self.lane.settle_tool(call.call_id,
                                      self.recent_entry(call.call_id, result, call.name), call)
            except Exception as exc:  # the lane broke: the result still settles below
                self.host.crashed(exc)
        self.running.pop(call.call_id, None)
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
        if durable:
            self.mark_settled(call.call_id)
            self._written(result_.details.truncation.total_bytes)
        self.known.wake(call.call_id)
        slog.info("tool.settled", exit_code=result_.exit_code, error_code=result_.error_code,
                  durable=durable, total_bytes=result_.details.truncation.total_bytes)

    async def settle_orphans(self) -> None:
        """Settle the calls no task settled (a crash, or a call that never got its task)."""
        crash = self.host.crash_text() or "unknown error"
        for call in list(self.running.values()):
            if call.started:
                code, text = "TOOL_OUTCOME_UNKNOWN", (
                    f"the session crashed ({crash}) while the call ran and dshd could not "
                    "follow it; it may or may not have run; retry only if read-only or "
                    "idempotent, otherwise check the outside world first")
            else:
                code, text = "ABORTED_BEFORE_DISPATCH", (
                    f"the session crashed ({crash}) before the call started; nothing ran")
            try:
                await self._settle(call, self._failed(call, code, text),
                                   log.bind(session=self.host.id, call=call.call_id))
            except Exception as exc:
                log.error("session.settle_failed", session=self.host.id, call=call.call_id,
                          error=repr(exc))

    def wake_all(self) -> None:
        """The session has ended: every waiter wakes (``wait`` says what is missing)."""
        self.known.wake_all()

    # ----------------------------------------------------------------- the port's verbs
    async def wait(self, call_id: str, timeout: float | None, *, ended: bool) -> dict | None:
        """The call's result once durable; None on timeout. ``ended``: the session's task has
        finished (nothing will flush again). Raises ``errors.CallNotFound``, StorageError."""
        if call_id not in self.known:
            raise errors.CallNotFound(f"call {call_id} not found in session {self.host.id}")
        found = False
        with trio.move_on_after(math.inf if timeout is None else timeout):
            if not self.known.is_settled(call_id):  # a settled, durable call answers even at
                await self.known.waiter(call_id).wait()  # timeout 0 (a poll)
            if not self.known.is_settled(call_id):  # woken by the end of a crashed session
                raise StorageError(
                    f"session {self.host.id} stopped ({self.host.crash_text() or 'unknown error'}"
                    f") before the result of call {call_id} was recorded; ask again: the session "
                    "reopens from its log, which says what happened"
                )
            seq = self.known.seq(call_id)
            assert seq is not None
            if seq > self.log.durable_seq:
                # Never claim a result that is not durable: retry the flush (StorageError
                # reaches the client as -32014) before answering.
                if ended:
                    raise StorageError(
                        f"session {self.host.id} stopped before the result of call {call_id} "
                        "was made durable; ask again: the session reopens from its log, which "
                        "says what happened"
                    )
                await self.log.wait_durable(seq)
            found = True
        # the cache, else the log (LogCorrupt): outside the timeout, which is for the settle
        return await self.known.result(call_id) if found else None

    def cancel(self, call_id: str) -> bool:
        """Cancel a running call (module doc); False when it has settled. CallNotFound."""
        if call_id not in self.known:
            raise errors.CallNotFound(f"call {call_id} not found in session {self.host.id}")
        call = self.running.get(call_id)
        if call is None:
            return False
        call.cancel()
        return True

    def stop(self, policy: StopPolicy = "cancel") -> None:
        """The session stops: refuse new calls and apply ``policy`` to the running ones
        (``cancel``: each is cancelled; ``detach``: a call at the gate or running under a host
        that keeps is let go -- no result, its approval undecided -- and one at the barrier
        is cancelled, since nothing ran)."""
        if policy not in ("cancel", "detach"):
            raise ValueError(f"unknown stop policy {policy!r}")
        self.stopping = True
        if policy == "detach":
            self.approvals.detach()
        for call in list(self.running.values()):
            if policy == "detach" and (call.stage == "gate"
                                       or (call.stage == "exec" and call.keeps)):
                call.detach.set()
                if call.stage == "gate":
                    call.scope.cancel()
            else:
                call.cancel()

    # ----------------------------------------------------------------- after a restart
    def reask(self, call_id: str, approval_id: str) -> None:
        """Ask ``approval_id`` again for a logged call that was waiting for approval when the
        daemon stopped (HOST.md §7): the call is rebuilt at stage ``gate`` and runs the usual
        pipeline with ``ApprovalDesk.reask`` as its gate."""
        call = resumed.rebuild(self, call_id, "gate", "waiting-approval")

        async def gate(call_: Call) -> None:
            await self.approvals.reask(call_, approval_id,
                                       grace=self.config.reask_grace_seconds)

        self.host.spawn(self._run, call, lambda c: self._pipeline(c, gate))

    def adopt(self, call_id: str, record: dict | None, exit_record: dict | None,
              since: float) -> None:
        """Re-adopt a logged call whose host outlived the daemon (``record``: its live
        ``host.json``) or settle it from its host's ``exit_record`` (``dshd.sessions.resumed``;
        ``since``: when this daemon started)."""
        call = resumed.rebuild(self, call_id, "exec", "running")
        self.host.spawn(self._run_adopted, call, record, exit_record, since)

    async def _run_adopted(self, call: Call, record: dict | None,
                           exit_record: dict | None, since: float) -> None:
        await self._run(call, lambda c: resumed.run_adopted(self, c, record, exit_record, since))

    def sync_outputs(self, publisher_task: bool) -> None:
        """Copy changed capture state onto the lane (the publisher's ``before_flush``)."""
        if (self.fault is not None and publisher_task
                and self.fault.hits("publish-crash", self.running.values())):
            raise InjectedFault("injected test fault (DSH_TEST_FAULT=publish-crash)")
        for call in self.running.values():
            sync_output(self.lane, call)
