"""The turn loop: one user input, model steps, tool calls, until a final answer (issue 5 §1–§3).

Theory of operation: each session has at most one :class:`TurnDriver` (``session.agent``,
made on the first ``turn.*`` request) and at most one running :class:`Turn`. ``turn.start``
appends ``turn/start`` + ``message/user`` and starts the loop as a task in the session's calls
nursery, so a turn lives as long as the session, never as long as the connection that asked.
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

Cancel: the model request's cancel scope is cancelled (what streamed so far is kept as a
``partial`` assistant message), running calls are cancelled (``TOOL_CANCELLED``; one still
waiting at the gate or its barrier settles ``APPROVAL_CANCELLED`` / ``ABORTED_BEFORE_DISPATCH``),
and proposed calls that had not started settle ``ABORTED_BEFORE_DISPATCH`` without a
``tool/call``. A proposed call refused before it starts (unknown tool, invalid arguments,
``LIMIT_EXCEEDED`` past ``max_calls_per_session`` / ``max_calls``) is settled the same way,
through ``Session.refuse_call``: in ``recent``, and ``tool.wait`` answers it at once. ``turn.steer`` queues text (bounded) that becomes a ``message/user`` at the next
step boundary; a steer that comes while the model gives its final answer earns one more step.

Lane ``turn`` value: ``null`` between turns, else ``{"turnId", "state", "step", "stepId",
"text", "calls"}``; ``text`` is the current step's assistant text (reset at each step start).

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
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
import trio

from protocol.errors import OpError
from protocol.ops import check_json_value

from .. import barrier
from ..results import sentence
from ..sessions.session import CallLimit
from ..storage.errors import StorageError
from .history import build_messages, default_system_prompt
from .model import ModelError, ModelRequest, ModelResponse, Provider, StreamHooks, open_provider
from .tools import TOOLS, parse_arguments, schemas

if TYPE_CHECKING:
    from ..sessions.session import Session

log = structlog.get_logger("dshd.agent")

#: Steers queued for one turn at most (more get -32013).
MAX_STEERS = 16

ABORTED_SENTENCE = sentence("ABORTED_BEFORE_DISPATCH", "turn")


class TurnBusy(Exception):
    def __init__(self, turn_id: str) -> None:
        super().__init__(turn_id)
        self.turn_id = turn_id


class NoTurn(Exception):
    pass


class SteerLimit(Exception):
    pass


def clean(text: str) -> str:
    """``text`` safe for the log and the lane: lone surrogates become U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _json_value(value) -> bool:
    """True when ``value`` may be recorded (OPS.md §1: ints within ±(2^53-1), finite floats)."""
    try:
        check_json_value(value)
    except OpError:
        return False
    return True


@dataclass
class Turn:
    id: str
    cancel: trio.Event = field(default_factory=trio.Event)
    steers: deque[str] = field(default_factory=deque)
    step_id: str | None = None
    steps: int = 0
    #: Cancel scope of the model request in flight (cancelled by turn.cancel).
    scope: trio.CancelScope | None = None
    #: Calls of the current step that were started and have not settled.
    running: set[str] = field(default_factory=set)
    #: The daemon is stopping: the turn ends ``interrupted`` rather than ``cancelled``.
    stopping: bool = False
    #: The loop has decided how the turn ends: steers are refused from here on.
    closing: bool = False


class TurnDriver:
    """The agent loop of one session (module doc). Get it with :meth:`of`."""

    def __init__(self, session: "Session") -> None:
        self.session = session
        self.turn: Turn | None = None

    @classmethod
    def of(cls, session: "Session") -> "TurnDriver":
        driver = session.agent
        if driver is None:
            driver = session.agent = cls(session)
        return driver

    # ------------------------------------------------------------------ requests
    def start(self, text: str) -> str:
        """Append turn/start + message/user and start the loop; returns the turnId.

        Raises TurnBusy (a turn is running), StorageError (the session is closing).
        """
        s = self.session
        if self.turn is not None:
            raise TurnBusy(self.turn.id)
        nursery = s._calls_nursery
        if nursery is None:
            raise StorageError("the session is closing; no new turns are accepted")
        turn = Turn("t-" + secrets.token_hex(6))
        s.log.append("turn/start", {"turnId": turn.id})
        s.log.append("message/user", {"turnId": turn.id, "text": clean(text)})
        self.turn = turn
        s.tracker.set(
            ["turn"],
            {"turnId": turn.id, "state": "starting", "step": 0, "stepId": None, "text": "",
             "calls": []},
        )
        # Publish now: every subscriber sees the turn begin, however short it turns out.
        s.publisher.publish_now()
        nursery.start_soon(self._run, turn)
        return turn.id

    def steer(self, text: str) -> str:
        """Queue ``text`` for the next step boundary; returns the turnId. Raises NoTurn,
        SteerLimit."""
        turn = self.turn
        if turn is None or turn.closing or turn.cancel.is_set():
            raise NoTurn()
        if len(turn.steers) >= MAX_STEERS:
            raise SteerLimit(f"turn {turn.id} already has {MAX_STEERS} queued steers")
        turn.steers.append(clean(text))
        return turn.id

    def cancel(self) -> bool:
        """Cancel the running turn (module doc); False when none runs."""
        turn = self.turn
        if turn is None:
            return False
        self._cancel(turn)
        return True

    def stop(self) -> None:
        """The session is closing: end the running turn as ``interrupted``."""
        if self.turn is not None:
            self.turn.stopping = True
            self._cancel(self.turn)

    def _cancel(self, turn: Turn) -> None:
        if turn.cancel.is_set():
            return
        turn.cancel.set()
        if turn.scope is not None:
            turn.scope.cancel()
        for call_id in list(turn.running):
            try:
                self.session.cancel_call(call_id)
            except KeyError:
                pass
        self._lane("state", "cancelling")

    # ------------------------------------------------------------------ lane
    def _lane(self, key: str, value) -> None:
        s = self.session
        if isinstance(s.tracker.value.get("turn"), dict):
            s.tracker.set(["turn", key], value)
            s.publisher.mark_dirty()

    # ------------------------------------------------------------------ the loop
    async def _run(self, turn: Turn) -> None:
        s = self.session
        slog = log.bind(session=s.id, turn=turn.id)
        try:
            try:
                async with open_provider(s.config.model) as provider:
                    try:
                        end = await self._loop(turn, provider, slog)
                    finally:
                        turn.closing = True
            except ModelError as exc:
                end = {"reason": "error", "errorCode": exc.code, "message": exc.sentence}
            except StorageError as exc:
                end = {"reason": "error", "errorCode": "STORAGE_FAILURE", "message": str(exc)}
            except Exception:
                slog.exception("turn.internal_error")
                end = {"reason": "error", "errorCode": "INTERNAL_ERROR",
                       "message": "internal error in dshd's agent loop; see the daemon log"}
        except BaseException:
            # Cancelled from outside (the daemon stops without the session's stop hook).
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._finish(turn, {"reason": "interrupted",
                                          "message": "dshd stopped during the turn"}, slog)
            raise
        await self._finish(turn, end, slog)

    def _cancelled(self, turn: Turn) -> dict:
        if turn.stopping:
            return {"reason": "interrupted", "message": "dshd stopped during the turn"}
        return {"reason": "cancelled"}

    async def _loop(self, turn: Turn, provider: Provider, slog) -> dict:
        s = self.session
        cfg = s.config.model
        system = cfg.system_prompt or default_system_prompt(s.log.header.cwd)
        for n in range(1, cfg.max_steps + 1):
            if turn.cancel.is_set():
                return self._cancelled(turn)
            self._take_steers(turn)
            turn.steps = n
            turn.step_id = step_id = f"s{n}"
            s.log.append("step/start", {"turnId": turn.id, "stepId": step_id})
            s.tracker.set(
                ["turn"],
                {"turnId": turn.id, "state": "running", "step": n, "stepId": step_id,
                 "text": "", "calls": []},
            )
            s.publisher.mark_dirty()
            try:
                await barrier.checkpoint(
                    s.log, s.log.last_seq, kind="agent/pre-step", cancel=turn.cancel
                )
                response = await self._ask(turn, provider, build_messages(s.log.events, system))
            except barrier.BarrierFailed as failed:
                self._end_step(turn)
                if failed.code == "ABORTED_BEFORE_DISPATCH":
                    return self._cancelled(turn)
                return {"reason": "error", "errorCode": failed.code, "message": failed.sentence}
            except ModelError as exc:
                self._end_step(turn)
                slog.warning("turn.model_error", code=exc.code, error=exc.sentence)
                return {"reason": "error", "errorCode": exc.code, "message": exc.sentence}
            if response is None:  # cancelled while the model answered
                self._end_step(turn)
                return self._cancelled(turn)
            calls = self._record_answer(turn, response)
            if not calls:
                self._end_step(turn)
                if turn.steers and not turn.cancel.is_set():
                    continue  # a steer came while the model answered: it gets a step
                return {"reason": "completed"}
            self._lane("calls", [cid for cid, _ in calls])
            self._lane("state", "waiting-tools" if not turn.cancel.is_set() else "cancelling")
            await self._run_calls(turn, calls)
            self._end_step(turn)
            if turn.cancel.is_set():
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
            self.session.log.append(
                "message/user", {"turnId": turn.id, "text": turn.steers.popleft(), "steer": True}
            )

    def _end_step(self, turn: Turn) -> None:
        if turn.step_id is not None:
            self.session.log.append("step/end", {"turnId": turn.id, "stepId": turn.step_id})
            turn.step_id = None

    async def _ask(self, turn: Turn, provider: Provider, messages: list[dict]) -> ModelResponse | None:
        """One model request; None when turn.cancel cut it short (partial text recorded)."""
        s = self.session
        streamed: list[str] = []

        async def before_send() -> None:
            await barrier.checkpoint(s.log, s.log.last_seq, kind="llm/stream", cancel=turn.cancel)

        def on_text(delta: str) -> None:
            piece = clean(delta)
            streamed.append(piece)
            s.tracker.append(["turn", "text"], piece)
            s.publisher.mark_dirty()

        def on_restart() -> None:
            streamed.clear()
            s.tracker.set_text(["turn", "text"], "")
            s.publisher.mark_dirty()

        hooks = StreamHooks(before_send=before_send, on_text=on_text, on_restart=on_restart)
        response: ModelResponse | None = None
        with trio.CancelScope() as scope:
            turn.scope = scope
            if turn.cancel.is_set():
                scope.cancel()
            try:
                response = await provider.complete(ModelRequest(messages, schemas()), hooks)
            finally:
                turn.scope = None
        if response is None:
            partial = "".join(streamed)
            if partial:
                s.log.append(
                    "message/assistant",
                    {"turnId": turn.id, "stepId": turn.step_id, "text": partial, "partial": True},
                )
        return response

    def _record_answer(self, turn: Turn, response: ModelResponse) -> list[tuple[str, object]]:
        """Append message/assistant; returns the proposed calls with their minted callIds."""
        s = self.session
        text = clean(response.text)
        calls = []
        for proposed in response.calls:
            call_id = "m-" + secrets.token_hex(8)
            while call_id in s.call_ids or call_id in s.results:
                call_id = "m-" + secrets.token_hex(8)
            calls.append((call_id, proposed))
        data: dict = {"turnId": turn.id, "stepId": turn.step_id, "text": text}
        if calls:
            data["toolCalls"] = [
                {"callId": cid, "name": clean(p.name), "arguments": clean(p.arguments)}
                for cid, p in calls
            ]
        if response.finish_reason:
            data["finishReason"] = clean(response.finish_reason)
        if response.model:
            data["model"] = clean(response.model)
        if response.usage is not None and _json_value(response.usage):
            data["usage"] = response.usage  # a provider's counts: recorded only when JSON values
        if response.attempts > 1:
            data["attempts"] = response.attempts
        s.log.append("message/assistant", data)
        s.tracker.set_text(["turn", "text"], text)
        s.publisher.mark_dirty()
        return calls

    async def _run_calls(self, turn: Turn, calls: list) -> None:
        """Run the step's calls: a run of ``concurrent`` tools side by side, others alone."""
        groups: list[list] = []
        for item in calls:
            spec = TOOLS.get(item[1].name)
            if spec is not None and spec.concurrent and groups and groups[-1][-1][2]:
                groups[-1].append((*item, True))
            else:
                groups.append([(*item, bool(spec and spec.concurrent))])
        for group in groups:
            started = []
            for call_id, proposed, _ in group:
                name = clean(proposed.name)
                if turn.cancel.is_set():
                    self.session.refuse_call(call_id, name, "ABORTED_BEFORE_DISPATCH",
                                             ABORTED_SENTENCE)
                    continue
                arguments, code, text = parse_arguments(name, clean(proposed.arguments))
                if arguments is None:
                    self.session.refuse_call(call_id, name, code or "INVALID_ARGUMENTS",
                                             text or "")
                    continue
                try:
                    self.session.start_call(
                        call_id, proposed.name, arguments, False,
                        turn_id=turn.id, step_id=turn.step_id,
                    )
                except CallLimit as exc:
                    self.session.refuse_call(call_id, name, "LIMIT_EXCEEDED",
                                             sentence("LIMIT_EXCEEDED", limit=exc))
                    continue
                turn.running.add(call_id)
                started.append(call_id)
            for call_id in started:
                await self.session.wait_result(call_id, None)
                turn.running.discard(call_id)

    async def _finish(self, turn: Turn, end: dict, slog) -> None:
        """Close the step, keep leftover steers, append turn/end, clear the lane."""
        s = self.session
        seq = None
        try:
            self._end_step(turn)
            self._take_steers(turn)
            seq = s.log.append("turn/end", {"turnId": turn.id, **end}).seq
        except (StorageError, ValueError) as exc:
            slog.error("turn.end_not_logged", error=str(exc))
        if self.turn is turn:
            self.turn = None
        if s.tracker.value.get("turn") is not None:
            s.tracker.set(["turn"], None)
            s.publisher.mark_dirty()
        slog.info("turn.ended", steps=turn.steps, **end)
        if seq is not None:
            try:
                await s.log.wait_durable(seq)
            except StorageError as exc:
                slog.error("turn.end_not_durable", error=str(exc))
