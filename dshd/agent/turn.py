"""The turn loop: one user input, model steps, tool calls, until a final answer (issue 5 §1–§3).

Theory of operation: each session has at most one :class:`TurnDriver` (``session.agent``,
made on the first ``turn.*`` request) and at most one running :class:`Turn`. The driver talks
to its session only through ``dshd.agent.port.SessionPort``. ``turn.start`` appends
``turn/start`` + ``message/user`` and starts the loop as a task of the session (``spawn``), so
a turn lives as long as the session, never as long as the connection that asked.
One step is::

    [steers → message/user]  step/start ─► agent/pre-step barrier (flush)
      ─► history from the log ─► model request (llm/stream barrier right before it is sent)
      ─► text deltas grow the lane's turn.text (``a`` ops)
      ─► message/assistant {text, toolCalls [{callId, name, arguments}]}
      ─► the calls, through the same pipeline as a frontend's (tool/call → gate → barrier →
         sandbox → exec → tool/result); ``concurrent`` tools side by side, others one at a time
      ─► step/end

and the loop repeats until the model answers without tool calls (``turn/end completed``), the
step limit is hit (``error``, ``STEP_LIMIT``), ``turn.cancel`` (``cancelled``), a failure
(``error`` with an ``errorCode`` and a sentence: ``STORAGE_FAILURE`` when a barrier's flush
failed — fail closed, nothing was sent — ``MODEL_*`` from the provider), or the daemon
stopping (``interrupted``). Model calls are never pre-approved: they pass the approval gate.

Restart (HOST.md §7, ``dshd.agent.resume``): a daemon stop with ``on_stop = "detach"``
(:meth:`TurnDriver.stop` with ``"detach"``) while the step waits for its tool calls ends the
turn's task and records nothing (no ``step/end``, no ``turn/end``; queued steers are recorded
as ``message/user``): the calls run on in their call hosts, and after the start the session
hands the open turn to :meth:`TurnDriver.resume`, which waits for those calls' results and
goes on with the next step, as if no restart happened. A stop while the model request is in
flight (or before the first step) ends the turn ``interrupted`` as before: that request's
answer is lost, and repeating it silently is not this loop's call to make.

Cancel: the step's cancel scope (its barriers and the model request) is cancelled (what
streamed so far is kept as a ``partial`` assistant message), running calls are cancelled
(``TOOL_CANCELLED``; one still waiting at the gate or its barrier settles
``APPROVAL_CANCELLED`` / ``ABORTED_BEFORE_DISPATCH``), and proposed calls that had not started
settle ``ABORTED_BEFORE_DISPATCH`` without a ``tool/call``.

Every call the model proposes is known to the session (``propose_call``) as soon as the answer
naming it is recorded, so ``tool.wait`` on it waits instead of answering ``-32006``. One the
loop refuses before it starts (unknown tool, invalid arguments: at once, before any call of
the step runs; ``LIMIT_EXCEEDED`` past ``max_calls_per_session`` / ``max_calls`` when its turn
comes) is settled through ``settle_unstarted``: in ``recent``, and ``tool.wait`` answers it at
once. Whatever ends the turn, a proposed call that never started is settled before
``turn/end`` (``ABORTED_BEFORE_DISPATCH``). ``turn.steer`` queues text (bounded) that becomes a
``message/user`` at the next step boundary; a steer that comes while the model gives its final
answer earns one more step.

Lane ``turn`` value: ``null`` between turns, else ``{"turnId", "state", "step", "stepId",
"text", "calls"}``; ``text`` is the current step's assistant text (reset at each step start);
``calls`` the calls its answer named (``protocol.lane.TurnCall``: ``callId``, ``name``,
``state`` ``proposed`` → ``waiting-approval`` → ``running`` → ``settled`` with ``exitCode`` and
``errorCode``), set once the answer is recorded, before any of them is settled or started; the
lane moves each call's state as the call moves (``dshd.sessions.lane``).

=================  ==============================================================
state              meaning
=================  ==============================================================
starting           turn/start appended; the first step has not begun
running            a step waits for (or streams) the model's answer
waiting-tools      the step's tool calls are running (``calls`` names them)
cancelling         turn.cancel (or shutdown) came; the step is unwinding
=================  ==============================================================
"""

from __future__ import annotations

import secrets

import structlog
import trio

from protocol.lane import TurnCall, TurnView

from .. import errors
from ..results import sentence
from ..sessions import barrier
from ..storage.errors import StorageError
from .history import build_messages, default_system_prompt
from .model import ModelError, ModelRequest, ModelResponse, Provider, StreamHooks
from .port import SessionPort
from .providers import open_provider
from .state import Proposed, Turn, clean, json_value
from .tools import TOOLS, parse_arguments, schemas

log = structlog.get_logger("dshd.agent")

#: Steers queued for one turn at most (more get -32013).
MAX_STEERS = 16

ABORTED_SENTENCE = sentence("ABORTED_BEFORE_DISPATCH", "turn")
#: turn/end's message when the daemon stopped during the turn.
STOPPED_TEXT = "dshd stopped during the turn"


class TurnDriver:
    """The agent loop of one session (module doc). Get it with :meth:`of`."""

    def __init__(self, port: SessionPort) -> None:
        self.port = port
        self.turn: Turn | None = None

    @classmethod
    def of(cls, port: SessionPort) -> "TurnDriver":
        driver = port.agent
        if driver is None:
            driver = port.agent = cls(port)
        return driver

    def busy(self) -> bool:
        """A turn runs (the session is not idle)."""
        return self.turn is not None

    # ------------------------------------------------------------------ requests
    def start(self, text: str, ask_grace: float | None = None) -> str:
        """Append turn/start + message/user and start the loop; returns the turnId.
        ``ask_grace``: seconds its calls wait for an answerer (None: the daemon's
        ``turn_ask_grace_seconds``).

        Raises ``errors.TurnBusy`` (a turn is running), ``errors.SessionClosing``.
        """
        port = self.port
        if self.turn is not None:
            raise errors.TurnBusy(port.id, self.turn.id)
        if not port.accepting():
            raise errors.SessionClosing(
                "storage failure: the session is closing; no new turns are accepted")
        turn = Turn("t-" + secrets.token_hex(6), ask_grace=ask_grace)
        port.record("turn/start", {"turnId": turn.id})
        port.record("message/user", {"turnId": turn.id, "text": clean(text)})
        self.turn = turn
        port.turn_lane.begin_turn(TurnView(turn.id, "starting", 0, None, "", []))
        port.spawn(self._run, turn)
        return turn.id

    def steer(self, text: str) -> str:
        """Queue ``text`` for the next step boundary; returns the turnId. Raises
        ``errors.NoTurn``, ``errors.SteerLimit``."""
        turn = self.turn
        if turn is None or turn.closing or turn.cancelled:
            raise errors.NoTurn(self.port.id)
        if len(turn.steers) >= MAX_STEERS:
            raise errors.SteerLimit(turn.id, MAX_STEERS)
        turn.steers.append(clean(text))
        return turn.id

    def cancel(self) -> bool:
        """Cancel the running turn (module doc); False when none runs."""
        turn = self.turn
        if turn is None:
            return False
        self._cancel(turn)
        return True

    def resume(self, turn_id: str, step: int, step_id: str, text: str,
               calls: list[str | TurnCall]) -> None:
        """Take up turn ``turn_id`` from the log after a restart (``dshd.agent.resume``): its
        open step ``step_id`` (number ``step``) named ``calls`` (ids, or their lane entries as
        the log has them); wait for their results, then go on with the next step. Raises
        ``errors.TurnBusy``, ``errors.SessionClosing``."""
        port = self.port
        if self.turn is not None:
            raise errors.TurnBusy(port.id, self.turn.id)
        views = [c if isinstance(c, TurnCall) else TurnCall(c, None, "proposed") for c in calls]
        ids = [c.call_id for c in views]
        turn = Turn(turn_id, step_id=step_id, steps=step, running=set(ids))
        self.turn = turn
        port.turn_lane.begin_turn(TurnView(turn_id, "waiting-tools", step, step_id, text, []))
        port.turn_lane.turn_calls(views)
        try:
            port.spawn(self._run, turn, ids)
        except BaseException:
            self.turn = None
            port.turn_lane.set_turn(None)
            raise

    def stop(self, policy: str = "cancel") -> None:
        """The session is closing: end the running turn as ``interrupted`` — or, for a daemon
        stop with ``policy == "detach"`` while its step waits for tool calls, end only its task
        and leave the turn open in the log to be resumed after the start (module doc)."""
        turn = self.turn
        if turn is None:
            return
        if policy == "detach" and turn.running and turn.scope is None and not turn.cancelled:
            turn.detached = True
            if turn.task_scope is not None:
                turn.task_scope.cancel()
            return
        turn.stopping = True
        self._cancel(turn)

    def _cancel(self, turn: Turn) -> None:
        if turn.cancelled:
            return
        turn.cancelled = True
        if turn.scope is not None:
            turn.scope.cancel()
        for call_id in list(turn.running):
            try:
                self.port.cancel_call(call_id)
            except errors.CallNotFound:
                pass
        self.port.turn_lane.update_turn("state", "cancelling")

    # ------------------------------------------------------------------ the loop
    async def _run(self, turn: Turn, waiting: list[str] | None = None) -> None:
        """The turn's task: the loop (``waiting``: a resumed turn's calls, awaited first)."""
        slog = log.bind(session=self.port.id, turn=turn.id)
        with trio.CancelScope() as scope:
            turn.task_scope = scope
            if turn.detached:
                scope.cancel()
            await self._run_turn(turn, waiting, slog)
        if turn.detached:
            self._detach(turn, slog)

    def _detach(self, turn: Turn, slog) -> None:
        """A detaching stop ended the task: keep the steers, leave the turn open in the log."""
        try:
            self._take_steers(turn)
        except (StorageError, ValueError) as exc:
            slog.error("turn.steers_not_logged", error=str(exc))
        if self.turn is turn:
            self.turn = None
        self.port.turn_lane.set_turn(None)
        slog.info("turn.detached", steps=turn.steps, waiting=sorted(turn.running))

    async def _run_turn(self, turn: Turn, waiting: list[str] | None, slog) -> None:
        try:
            try:
                async with open_provider(self.port.config.model) as provider:
                    try:
                        end = await self._loop(turn, provider, slog, waiting)
                    finally:
                        turn.closing = True
            except ModelError as exc:
                end = {"reason": "error", "errorCode": exc.code, "message": exc.sentence}
            except errors.SessionClosing:  # a stop between two steps: the turn is interrupted
                end = {"reason": "interrupted", "message": STOPPED_TEXT}
            except errors.StorageFailure as exc:
                end = {"reason": "error", "errorCode": "STORAGE_FAILURE", "message": str(exc)}
            except Exception:
                slog.exception("turn.internal_error")
                end = {"reason": "error", "errorCode": "INTERNAL_ERROR",
                       "message": "internal error in dshd's agent loop; see the daemon log"}
        except BaseException:
            if turn.detached:  # a detaching stop: nothing is recorded (module doc)
                raise
            # Cancelled from outside (the daemon stops without the session's stop hook).
            with trio.CancelScope(shield=True), trio.move_on_at(self.port.deadline()):
                await self._finish(turn, {"reason": "interrupted",
                                          "message": STOPPED_TEXT}, slog)
            raise
        await self._finish(turn, end, slog)

    def _cancelled(self, turn: Turn) -> dict:
        if turn.stopping:
            return {"reason": "interrupted", "message": STOPPED_TEXT}
        return {"reason": "cancelled"}

    async def _loop(self, turn: Turn, provider: Provider, slog,
                    waiting: list[str] | None = None) -> dict:
        port = self.port
        cfg = port.config.model
        system = cfg.system_prompt or default_system_prompt(port.cwd)
        if waiting is not None:  # a resumed turn: its open step's calls first
            await self._wait_calls(turn, waiting)
            self._end_step(turn)
            if turn.cancelled:
                return self._cancelled(turn)
        for n in range(turn.steps + 1, cfg.max_steps + 1):
            if turn.cancelled:
                return self._cancelled(turn)
            self._take_steers(turn)
            turn.steps = n
            turn.step_id = step_id = f"s{n}"
            port.record("step/start", {"turnId": turn.id, "stepId": step_id})
            port.turn_lane.set_turn(TurnView(turn.id, "running", n, step_id, "", []))
            try:
                response = await self._step(turn, provider, system)
            except barrier.BarrierFailed as failed:
                self._end_step(turn)
                return {"reason": "error", "errorCode": failed.code, "message": failed.sentence}
            except ModelError as exc:
                self._end_step(turn)
                slog.warning("turn.model_error", code=exc.code, error=exc.sentence)
                return {"reason": "error", "errorCode": exc.code, "message": exc.sentence}
            if response is None:  # cancelled at a barrier or while the model answered
                self._end_step(turn)
                return self._cancelled(turn)
            calls = self._record_answer(turn, response)
            if not response.calls:
                self._end_step(turn)
                if turn.steers and not turn.cancelled:
                    continue  # a steer came while the model answered: it gets a step
                return {"reason": "completed"}
            await self._run_calls(turn, calls)
            self._end_step(turn)
            if turn.cancelled:
                return self._cancelled(turn)
        return {
            "reason": "error",
            "errorCode": "STEP_LIMIT",
            "message": f"the turn stopped after {cfg.max_steps} steps ([model].max_steps) "
            "without a final answer; the last results are in the log, and the next "
            "turn.start continues from them",
        }

    def _take_steers(self, turn: Turn) -> None:
        while turn.steers:
            self.port.record(
                "message/user", {"turnId": turn.id, "text": turn.steers.popleft(), "steer": True}
            )

    def _end_step(self, turn: Turn) -> None:
        if turn.step_id is not None:
            self.port.record("step/end", {"turnId": turn.id, "stepId": turn.step_id})
            turn.step_id = None

    async def _step(self, turn: Turn, provider: Provider, system: str) -> ModelResponse | None:
        """The pre-step barrier and one model request, in the step's cancel scope; None when
        turn.cancel cut it short (partial text recorded)."""
        port = self.port
        lane = port.turn_lane
        streamed: list[str] = []

        async def before_send() -> None:
            await barrier.checkpoint(port, port.last_seq, kind="llm/stream")

        def on_text(delta: str) -> None:
            piece = clean(delta)
            streamed.append(piece)
            lane.turn_text(piece, append=True)

        def on_restart() -> None:
            streamed.clear()
            lane.turn_text("")

        hooks = StreamHooks(before_send=before_send, on_text=on_text, on_restart=on_restart)
        response: ModelResponse | None = None
        with trio.CancelScope() as scope:
            turn.scope = scope
            if turn.cancelled:
                scope.cancel()
            try:
                await barrier.checkpoint(port, port.last_seq, kind="agent/pre-step")
                messages = build_messages(await port.history(), system)
                response = await provider.complete(ModelRequest(messages, schemas()), hooks)
            finally:
                turn.scope = None
        if response is None and "".join(streamed):
            port.record("message/assistant", {"turnId": turn.id, "stepId": turn.step_id,
                                              "text": "".join(streamed), "partial": True})
        return response

    def _record_answer(self, turn: Turn, response: ModelResponse) -> list[Proposed]:
        """Append message/assistant, make every proposed call known (waitable), settle the ones
        refused on sight (unknown tool, invalid arguments); the calls left to start."""
        port = self.port
        text = clean(response.text)
        minted = []
        for proposed in response.calls:
            call_id = "m-" + secrets.token_hex(8)
            while port.has_call(call_id):
                call_id = "m-" + secrets.token_hex(8)
            minted.append((call_id, proposed))
        data: dict = {"turnId": turn.id, "stepId": turn.step_id, "text": text}
        if minted:
            data["toolCalls"] = [
                {"callId": cid, "name": clean(p.name), "arguments": clean(p.arguments)}
                for cid, p in minted
            ]
        if response.finish_reason:
            data["finishReason"] = clean(response.finish_reason)
        if response.model:
            data["model"] = clean(response.model)
        if response.usage is not None and json_value(response.usage):
            data["usage"] = response.usage  # a provider's counts: recorded only when JSON values
        if response.attempts > 1:
            data["attempts"] = response.attempts
        port.record("message/assistant", data)
        port.turn_lane.turn_text(text)
        if minted:  # before any is settled or started: the lane moves their states from here
            port.turn_lane.turn_calls([TurnCall(cid, clean(p.name), "proposed")
                                       for cid, p in minted])
            port.turn_lane.update_turn("state", "cancelling" if turn.cancelled else "waiting-tools")
        calls = []
        for call_id, proposed in minted:
            name = clean(proposed.name)
            port.propose_call(call_id, name)
            arguments, code, problem = parse_arguments(name, clean(proposed.arguments))
            if arguments is None:
                port.settle_unstarted(call_id, name, code or "INVALID_ARGUMENTS", problem or "")
                continue
            turn.unstarted[call_id] = name
            spec = TOOLS.get(proposed.name)
            calls.append(Proposed(call_id, name, proposed.name, arguments,
                                  bool(spec and spec.concurrent)))
        return calls

    async def _run_calls(self, turn: Turn, calls: list[Proposed]) -> None:
        """Run the step's calls: a run of ``concurrent`` tools side by side, others alone."""
        groups: list[list[Proposed]] = []
        for call in calls:
            if call.concurrent and groups and groups[-1][-1].concurrent:
                groups[-1].append(call)
            else:
                groups.append([call])
        for group in groups:
            await self._wait_calls(turn, [call.call_id for call in group
                                          if self._start(turn, call)])

    async def _wait_calls(self, turn: Turn, call_ids: list[str]) -> None:
        """Wait for each call's result (a call the session does not know is not waited for)."""
        for call_id in call_ids:
            try:
                await self.port.wait_result(call_id, None)
            except errors.CallNotFound:
                log.warning("turn.call_unknown", session=self.port.id, turn=turn.id,
                            call=call_id)
            turn.running.discard(call_id)

    def _start(self, turn: Turn, call: Proposed) -> bool:
        """Start one proposed call; False when it was refused (and settled) instead."""
        port = self.port
        del turn.unstarted[call.call_id]
        if turn.cancelled:
            port.settle_unstarted(call.call_id, call.name, "ABORTED_BEFORE_DISPATCH",
                                  ABORTED_SENTENCE)
            return False
        try:
            port.start_call(call.call_id, call.raw_name, call.arguments, False,
                            turn_id=turn.id, step_id=turn.step_id, ask_timeout=turn.ask_grace)
        except errors.CallLimit as exc:
            port.settle_unstarted(call.call_id, call.name, "LIMIT_EXCEEDED",
                                  sentence("LIMIT_EXCEEDED", limit=exc.limit))
            return False
        except BaseException:
            turn.unstarted[call.call_id] = call.name  # settled by _finish
            raise
        turn.running.add(call.call_id)
        return True

    async def _finish(self, turn: Turn, end: dict, slog) -> None:
        """Settle proposed calls that never started, close the step, keep leftover steers,
        append turn/end, clear the lane."""
        port = self.port
        seq = None
        try:
            for call_id, name in list(turn.unstarted.items()):
                del turn.unstarted[call_id]
                port.settle_unstarted(call_id, name, "ABORTED_BEFORE_DISPATCH", ABORTED_SENTENCE)
            self._end_step(turn)
            self._take_steers(turn)
            seq = port.record("turn/end", {"turnId": turn.id, **end})
        except (StorageError, ValueError) as exc:
            slog.error("turn.end_not_logged", error=str(exc))
        if self.turn is turn:
            self.turn = None
        port.turn_lane.set_turn(None)
        slog.info("turn.ended", steps=turn.steps, **end)
        if seq is not None:
            try:
                await port.wait_durable(seq)
            except StorageError as exc:
                slog.error("turn.end_not_durable", error=str(exc))
