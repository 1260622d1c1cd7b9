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
  and a sentence a person can act on.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import structlog
import trio

from protocol.codec import Encoder
from protocol.tracker import Tracker

from .. import barrier, identity
from ..approval import ApprovalDesk
from ..config import Config
from ..execution.capture import OutputCapture, ShellOutputLimits, SpillSink
from ..execution.env import tool_env
from ..execution.process import BashScript, run_command
from ..execution.sandbox import SandboxUnavailable
from ..paths import is_within
from ..storage.errors import StorageError
from ..storage.sidecar import PendingOutput
from ..storage.writer import SessionLog
from .streams import Publisher, Subscription

log = structlog.get_logger("dshd.session")

RECENT_MAX = 20
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

    def __init__(self, log_: SessionLog, session_dir: Path, config: Config, sandbox) -> None:
        self.log = log_
        self.id = log_.header.id
        self.dir = session_dir
        self.config = config
        self.sandbox = sandbox
        self.calls: dict[str, Call] = {}
        self.call_ids: set[str] = set()
        self.call_names: dict[str, str] = {}
        self.results: dict[str, dict] = {}
        self._undurable: dict[str, int] = {}  # callId -> seq of a result not yet durable
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
        for ev in log_.events:
            self._absorb(ev.type, ev.data, recent)
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

    def events(self, after_seq: int, limit: int) -> list:
        """Events with seq > after_seq, oldest first, unflushed tail included."""
        evs = self.log.events
        start = max(after_seq + 1, 0)
        return evs[start : start + limit]

    # ----------------------------------------------------------------- lifetime
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Own the log writer, the publisher and the calls until the registry closes us."""
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.log.run)
                await nursery.start(self.publisher.run)
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
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                self.publisher.publish_now()
                try:
                    await self.log.aclose()
                except StorageError as exc:
                    log.error("session.close_failed", session=self.id, error=str(exc))
            self.finished.set()

    def close(self) -> None:
        self._closed.set()

    def idle(self) -> bool:
        """No running call or turn, no subscriber, no pending approval: safe to close."""
        return (not self.calls and not self.publisher.subscriptions and not self.approvals.pending
                and (self.agent is None or self.agent.turn is None))

    # ----------------------------------------------------------------- policy / mode
    async def record_settings(
        self, *, policy: str, mode: str, env: dict, source: str, owner: int | None = None
    ) -> None:
        """Record a new session's owner, policy, sandbox mode and env, durably; show them."""
        if owner is not None:
            self.owner = owner
            self.log.append("session/owner", {"uid": owner}, ignorable=True)
        self.policy = policy
        self.mode = mode
        self.tracker.set(["session", "approvalPolicy"], policy)
        self.tracker.set(["session", "sandbox"], mode)
        self.publisher.mark_dirty()
        self.log.append("approval/policy", {"policy": policy, "source": source})
        self.log.append("sandbox/mode", {"mode": mode, "source": source})
        if env:
            self.env = dict(env)
            self.log.append("session/env", {"env": dict(env)}, ignorable=True)
        await self.log.flush()

    async def set_policy(self, policy: str, source: str) -> None:
        self.policy = policy
        ev = self.log.append("approval/policy", {"policy": policy, "source": source})
        self.tracker.set(["session", "approvalPolicy"], policy)
        self.publisher.mark_dirty()
        await self.log.wait_durable(ev.seq)

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
        with :meth:`wait_result`.
        """
        if self._calls_nursery is None:
            raise StorageError("the session is closing; no new calls are accepted")
        data = {"callId": call_id, "name": name, "arguments": _json.encode(arguments).decode()}
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
        limits = ShellOutputLimits(
            max_bytes=self.config.output_max_bytes, max_lines=self.config.output_max_lines
        )
        call.capture = OutputCapture(
            limits, SpillSink(self.dir / "spill" / f"{call_id}.log")
        )
        self.tracker.set(
            ["tools", call_id],
            {
                "name": name,
                "args": arguments,
                "state": "waiting-approval",
                "startedAt": now_ms(),
                "output": call.capture.tool_output(),
            },
        )
        call.synced_version = call.capture.version
        self.publisher.mark_dirty()
        self._calls_nursery.start_soon(self._run_call, call)

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
                result = self._failed_result(
                    call, "TOOL_FAILED",
                    f"dshd could not run this call ({type(exc).__name__}: {exc}); "
                    "see the daemon log",
                )
        except BaseException:
            # Shutdown cancelled us mid-call: settle as cancelled, shielded and bounded.
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                sentence = (
                    "the daemon stopped while the call ran; its process group was killed"
                    if call.started
                    else "the daemon stopped before the call started; nothing ran"
                )
                code = "TOOL_CANCELLED" if call.started else "ABORTED_BEFORE_DISPATCH"
                await self._settle(call, self._failed_result(call, code, sentence), slog)
            raise
        await self._settle(call, result, slog)

    async def _execute(self, call: Call) -> dict:
        args = call.arguments
        cwd = self.log.header.cwd
        if is_within(cwd, self.config.state_path()):
            raise CallFailed(
                "SANDBOX_UNAVAILABLE",
                f"the session directory {cwd} lies inside dshd's state directory, which no "
                "tool may touch; use a session in a project directory",
            )
        # The session env and the call's ids are set inside the sandbox (by env(1)), so that
        # nothing in them (LD_PRELOAD, say) reaches the sandbox wrapper itself.
        inner_env = dict(self.env)
        inner_env["DSH_CALL_ID"] = call.call_id
        inner_env["DSH_SESSION_ID"] = self.id
        inner = ["env", "--", *(f"{k}={v}" for k, v in inner_env.items())]
        script = BashScript(args["command"])  # run_command closes it
        try:
            argv, completeness = self.sandbox.confine(
                inner + script.argv,
                self.mode,
                cwd,
                hide=[str(self.config.state_path()), str(self.config.socket_path())],
                network=self.config.network,
            )
        except SandboxUnavailable as exc:
            script.close()
            raise CallFailed("SANDBOX_UNAVAILABLE", str(exc)) from None
        env = tool_base_env(self.config, self.owner)
        call.started = True
        self.tracker.set(["tools", call.call_id, "state"], "running")
        self.tracker.set(["tools", call.call_id, "startedAt"], now_ms())
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
                    spare_wrapper=(getattr(self.sandbox, "wrapper_comm", None)
                                   if completeness != "none" else None),
                    marker=f"DSH_CALL_ID={call.call_id}",
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
            result["message"] = (
                f"timed out after {args.get('timeout')} s; the process group was killed"
            )
        elif outcome.cancelled:
            result["errorCode"] = "TOOL_CANCELLED"
            result["message"] = (
                "dshd is shutting down: the call was cancelled and its process group killed"
                if self._closed.is_set()
                else "cancelled; the process group was killed"
            )
        elif outcome.error:
            result["errorCode"] = "TOOL_FAILED"
            result["message"] = outcome.error
        return result

    def _failed_result(self, call: Call, code: str, sentence: str) -> dict:
        result = {
            "callId": call.call_id,
            "isError": True,
            "content": sentence,
            "details": {},
            "errorCode": code,
        }
        if call.started and call.capture is not None:
            result["content"] = call.capture.text
            result["details"] = {"truncation": dict(call.capture.truncation)}
            if call.capture.spill_path:
                result["details"]["spillPath"] = call.capture.spill_path
            result["message"] = sentence
        return result

    async def _settle(self, call: Call, result: dict, slog) -> None:
        """Append ``tool/result``, make it durable, move the call from tools to recent."""
        ev = self.log.append("tool/result", result)
        self.results[call.call_id] = result
        # The final output state is always published before the call leaves the lane.
        self.publisher.publish_now()
        self.calls.pop(call.call_id, None)
        self.tracker.delete(["tools", call.call_id])
        for approval_id, entry in list(self.tracker.value["approvals"].items()):
            if entry.get("callId") == call.call_id:
                self.tracker.delete(["approvals", approval_id])
        self.tracker.insert(["recent"], 0, self._recent_entry(call.call_id, result))
        if len(self.tracker.value["recent"]) > RECENT_MAX:
            self.tracker.splice(["recent"], RECENT_MAX, len(self.tracker.value["recent"]) - RECENT_MAX, [])
        self.publisher.mark_dirty()
        durable = True
        try:
            await self.log.wait_durable(ev.seq)
        except StorageError as exc:
            durable = False
            self._undurable[call.call_id] = ev.seq
            slog.error("tool.result_not_durable", error=str(exc))
        if durable and call.pending is not None:
            await trio.to_thread.run_sync(call.pending.retire)
        self._settled[call.call_id].set()
        slog.info(
            "tool.settled",
            exit_code=result.get("exitCode"),
            error_code=result.get("errorCode"),
            durable=durable,
            total_bytes=(result.get("details") or {}).get("truncation", {}).get("totalBytes"),
        )

    async def wait_result(self, call_id: str, timeout: float | None) -> dict | None:
        """The call's result once durable; None on timeout. KeyError for an unknown call."""
        if call_id not in self.call_ids:
            raise KeyError(call_id)
        ev = self._settled.setdefault(call_id, trio.Event())
        with trio.move_on_after(math.inf if timeout is None else timeout):
            await ev.wait()
            seq = self._undurable.get(call_id)
            if seq is not None:
                # Never claim a result that is not durable: retry the flush (StorageError
                # reaches the client as -32014) before answering.
                await self.log.wait_durable(seq)
                self._undurable.pop(call_id, None)
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
