"""``dsh chat``: talk to a session's agent loop from a terminal (PROTOCOL.md §3.5).

Theory of operation: ``dsh chat`` connects as an approval answerer, subscribes to the session's
lane view and sends ``turn.start``. From then on the lane drives the screen:

* the turn's ``text`` (the current step's assistant text) prints as it grows;
* the calls the step proposed (``turn.calls``) print a header on stderr and their live output
  on stdout, followed with ``client.follow.CallOutput`` exactly like ``dsh attach``;
* approval requests go to the :class:`Approver`, which asks on the terminal (or allows them
  all with ``--yes``) and answers with ``approval.decide``.

A batch may fold several changes together (a short call can come and go between two
publishes), so whenever a step ends the log is the referee (its events typed by
``protocol.events``; a call's ``tool/result`` is the ``protocol.lane.ToolResult`` ``tool.wait``
answers): its ``message/assistant`` prints
whatever of the text the lane did not show, and each proposed call's ``tool/result`` closes
it (its last output, or the sentence of a call that never ran). The turn is over when the
lane's turn stops being ours; ``turn/end`` gives the exit status
(``client.exits.turn_status``): 0 completed, 1 error, 130 cancelled. Ctrl-C once cancels the turn, twice detaches (the turn goes on in dshd).
Without a prompt, lines are read from stdin, one turn each, until end of file.

stdin is read by one task for the whole command (:class:`Lines`), so a prompt for the next
input and an approval question never race for the same line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import anyio
import click

from client.api import CallLost, Client, connect
from client.cli.common import run_program
from client.exits import EXIT_INTERRUPTED, single, turn_status
from client.follow import CallOutput
from protocol.printable import printable
from client.spill import command_ran
from client.transport import ConnectionLost
from protocol.events import (
    AnyEvent,
    AssistantMessage,
    AssistantMessageData,
    ToolResultEvent,
    TurnEnd,
    TurnEndData,
)
from protocol.rpc import RpcError

__all__ = ["chat", "run_chat"]


# ---------------------------------------------------------------------- terminal
def _emit(text: str) -> None:
    """Assistant text and tool output: stdout, as is, at once."""
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def _note(text: str, *, dim: bool = False) -> None:
    """One line on stderr; what came over the wire in it is shown escaped (``printable``)."""
    text = printable(text, keep="\n\t")
    click.echo(click.style(text, dim=dim) if sys.stderr.isatty() else text, err=True)


class Lines:
    """stdin, one line at a time, read by a single task (``run``); None at end of file."""

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[str | None](0)

    async def run(self) -> None:
        async with self._send:  # closed at end of file: every later next() is None
            while True:
                line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                if not line:
                    return
                await self._send.send(line.rstrip("\n"))

    async def next(self, prompt: str = "") -> str | None:
        if prompt:
            sys.stderr.write(printable(prompt, keep="\n\t"))
            sys.stderr.flush()
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            return None


class Approver:
    """Answers the session's approval requests for this chat: ``--yes`` allows, else asks."""

    def __init__(self, client: Client, session_id: str, lines: Lines, yes: bool) -> None:
        self.client = client
        self.session_id = session_id
        self.lines = lines
        self.yes = yes
        self.seen: set[str] = set()
        self.pending: dict[str, dict] = {}
        self._asking: tuple[str, anyio.CancelScope] | None = None
        self._send, self._receive = anyio.create_memory_object_stream[str](64)

    def offer(self, view: Any) -> None:
        """Queue the view's new approval requests; drop the question about one that left
        (decided elsewhere, or cancelled with its turn), so it does not eat the next line."""
        approvals = view.get("approvals") if isinstance(view, dict) else None
        approvals = approvals if isinstance(approvals, dict) else {}
        if self._asking is not None and self._asking[0] not in approvals:
            self._asking[1].cancel()
        for approval_id, entry in approvals.items():
            if approval_id in self.seen:
                continue
            try:
                self._send.send_nowait(approval_id)
            except anyio.WouldBlock:
                continue  # offered again with the next view
            self.seen.add(approval_id)
            self.pending[approval_id] = entry

    async def run(self) -> None:
        async for approval_id in self._receive:
            entry = self.pending.pop(approval_id)
            with anyio.CancelScope() as scope:
                self._asking = (approval_id, scope)
                await self._answer(approval_id, entry)
            self._asking = None
            if scope.cancelled_caught:
                _note("\n── no longer pending", dim=True)

    async def _answer(self, approval_id: str, entry: dict) -> None:
        summary = entry.get("summary", "")
        if self.yes:
            allow = True
            _note(f"── allowing {entry.get('tool')}: {summary}", dim=True)
        else:
            answer = await self.lines.next(
                f"── allow {entry.get('tool')}: {summary}\n   run it? [y/N] "
            )
            allow = (answer or "").strip().lower() in ("y", "yes")
        self._asking = None  # answered: its leaving the view from here on is our own doing
        try:
            await self.client.decide(self.session_id, approval_id, "allow" if allow else "reject")
        except RpcError as exc:  # decided meanwhile (cancelled, answerer left…)
            _note(f"dsh: {exc.message}", dim=True)


# ---------------------------------------------------------------------- one turn
def _command_of(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    if isinstance(arguments, dict) and isinstance(arguments.get("command"), str):
        return arguments["command"]
    return json.dumps(arguments)


class TurnScreen:
    """What one turn has printed, and what is left to print (module doc)."""

    def __init__(self, client: Client, session_id: str, turn_id: str, after_seq: int) -> None:
        self.client = client
        self.session_id = session_id
        self.turn_id = turn_id
        self.after_seq = after_seq
        self.step: str | None = None
        self.printed: dict[str, str] = {}
        self.outputs: dict[str, CallOutput] = {}
        self.headed: set[str] = set()
        self.closed_calls: set[str] = set()
        self.closed_steps: set[str] = set()
        self.seen = False
        self.end: TurnEndData | None = None
        self._line_start = True

    def open_call(self) -> str | None:
        """The last call shown that has not ended yet (None when there is none)."""
        open_calls = [c for c in self.outputs if c not in self.closed_calls]
        return open_calls[-1] if open_calls else None

    def _text(self, text: str) -> None:
        if text:
            _emit(text)
            self._line_start = text.endswith("\n")

    def _newline(self) -> None:
        if not self._line_start:
            _emit("\n")
            self._line_start = True

    async def _events(self) -> list[AnyEvent]:
        return [e async for e in self.client.iter_events(self.session_id, self.after_seq)]

    async def update(self, view: Any, ops: list) -> None:
        turn = view.get("turn") if isinstance(view, dict) else None
        if not (isinstance(turn, dict) and turn.get("turnId") == self.turn_id):
            if self.seen or await self._ended():
                await self.finish()
            return
        self.seen = True
        step = turn.get("stepId")
        if step != self.step:
            if step is not None:
                await self.close_steps(await self._events(), before=step)
            self.step = step
        if step is None:
            return
        text = turn.get("text") if isinstance(turn.get("text"), str) else ""
        shown = self.printed.get(step, "")
        if text.startswith(shown):
            self._text(text[len(shown):])
        else:  # a retried request started its text over
            self._newline()
            self._text(text)
        self.printed[step] = text
        tools = view.get("tools") if isinstance(view.get("tools"), dict) else {}
        for call_id in turn.get("calls") or []:
            if call_id in self.closed_calls or call_id not in tools:
                continue
            output = self.outputs.setdefault(call_id, CallOutput(call_id))
            if call_id not in self.headed:
                self._newline()
                entry = tools[call_id]
                _note(f"── {entry.get('name')}: {_command_of(entry.get('args'))}", dim=True)
                self.headed.add(call_id)
            self._text(output.update(ops, view))

    async def _ended(self) -> bool:
        """The turn is not in the view and was never seen there: over already?"""
        return any(isinstance(e, TurnEnd) and e.data.turn_id == self.turn_id
                   for e in await self._events())

    async def close_steps(self, events: list[AnyEvent], before: str | None = None) -> None:
        """Close, in log order, every step of the turn not closed yet (up to ``before``):
        steps can pass between two batches without the lane ever showing them."""
        answers: dict[Any, AssistantMessageData] = {}
        for e in events:
            if isinstance(e, AssistantMessage) and e.data.turn_id == self.turn_id:
                answers[e.data.step_id] = e.data  # the last one of a step wins
        for step, answer in answers.items():
            if step == before:
                return
            if step not in self.closed_steps:
                self.closed_steps.add(step)
                self.close_step(step, answer, events)

    def close_step(self, step: str, answer: AssistantMessageData,
                   events: list[AnyEvent]) -> None:
        """Print what the lane did not show of the step: its text's end, its calls' ends."""
        full = answer.text
        shown = self.printed.get(step, "")
        self._text(full[len(shown):] if full.startswith(shown) else "\n" + full)
        self.printed[step] = full
        results = {e.data.call_id: e.data for e in events if isinstance(e, ToolResultEvent)}
        for call in answer.tool_calls or []:  # UNSET (no calls) is falsy
            call_id = call.call_id
            result = results.get(call_id)
            if call_id in self.closed_calls or result is None:
                continue
            self.closed_calls.add(call_id)
            if call_id not in self.headed:
                self._newline()
                _note(f"── {call.name}: {_command_of(call.arguments)}", dim=True)
                self.headed.add(call_id)
            if command_ran(result):
                output = self.outputs.get(call_id)
                truncation = result.details.truncation
                total = truncation.total_bytes if truncation is not None else None
                cut = truncation.truncated if truncation is not None else None
                self._text(output.finish(result.content, total, cut) if output
                           else result.content)
            self._newline()
            code, exit_code = result.error_code, result.exit_code
            if code and not command_ran(result):
                _note(f"── not run: {code}: {result.content}", dim=True)
            elif code:
                _note(f"── {code}" + (f" (exit {exit_code})" if exit_code is not None else ""),
                      dim=True)
            else:
                _note(f"── exit {exit_code}", dim=True)
        self._newline()

    async def finish(self) -> None:
        events = await self._events()
        await self.close_steps(events)
        for e in events:
            if isinstance(e, TurnEnd) and e.data.turn_id == self.turn_id:
                self.end = e.data
        if self.end is None:
            self.end = TurnEndData(turn_id=self.turn_id, reason="error",
                                   message="the turn's end is not in the log yet")
        self._newline()


async def run_turn(client: Client, sub, session_id: str, text: str, approver: Approver) -> int:
    """One turn, shown until it ends; returns its exit status."""
    after_seq = (await client.get_session(session_id)).last_seq
    turn_id = await client.start_turn(session_id, text)
    screen = TurnScreen(client, session_id, turn_id, after_seq)
    try:
        return await _show_turn(client, sub, session_id, screen, approver)
    except BaseException as raised:  # noqa: BLE001 - re-raised, with the hint when dshd left
        lost = single(raised)
        call_id = screen.open_call()
        if call_id and isinstance(lost, ConnectionLost) and not isinstance(lost, CallLost):
            raise CallLost(lost, session_id, call_id) from raised
        raise


async def _show_turn(client: Client, sub, session_id: str, screen: TurnScreen,
                     approver: Approver) -> int:
    detached = False
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async with anyio.create_task_group() as nursery:

            async def on_interrupt() -> None:
                nonlocal detached
                cancelling = False
                async for _ in signals:
                    if not cancelling:
                        cancelling = True
                        _note("dsh: cancelling the turn (Ctrl-C again to detach)")
                        await client.cancel_turn(session_id)
                        continue
                    detached = True
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(on_interrupt)
            view = sub.mirror.value
            while True:
                approver.offer(view)
                await screen.update(view, sub.mirror.last_ops)
                if screen.end is not None:
                    break
                view = await sub.next_view()
            nursery.cancel_scope.cancel()
    if detached:
        _note(f"detached; the turn keeps running in dshd. Follow it: dsh attach {session_id}")
        return EXIT_INTERRUPTED
    end = screen.end
    reason = end.reason if end is not None else "error"
    if reason != "completed":
        parts = (end.error_code, end.message) if end is not None else ()
        detail = ": ".join(str(x) for x in parts if x)  # UNSET is falsy: left out
        _note(f"dsh: turn {reason}" + (f" ({detail})" if detail else ""))
    return turn_status(reason)


async def _chat(socket: str | None, session_id: str | None, prompt: str | None, yes: bool) -> int:
    async with connect(socket, approvals=True) as client:
        if session_id is None:
            title = (prompt or "chat")[:60]
            session_id = await client.create_session(os.getcwd(), title=title)
        _note(f"session {session_id}", dim=True)
        lines = Lines()
        sub = await client.subscribe(session_id)
        try:
            await sub.next_view()
            async with anyio.create_task_group() as nursery:
                approver = Approver(client, session_id, lines, yes)
                nursery.start_soon(lines.run)
                nursery.start_soon(approver.run)
                status = 0
                if prompt is not None:
                    status = await run_turn(client, sub, session_id, prompt, approver)
                else:
                    tty = sys.stdin.isatty()
                    while True:
                        line = await lines.next("› " if tty else "")
                        if line is None:
                            break
                        if line.strip():
                            status = await run_turn(client, sub, session_id, line, approver)
                nursery.cancel_scope.cancel()
            return status
        finally:
            with anyio.move_on_after(1, shield=True):
                await sub.aclose()


def run_chat(socket: str | None, session_id: str | None, prompt: str | None, yes: bool) -> int:
    """Run the chat; map client errors to one stderr line and an exit status."""
    return run_program(lambda: _chat(socket, session_id, prompt, yes))


@click.command("chat")
@click.option("--session", "session_id", metavar="ID", help="Talk in this session (default: a new one).")
@click.option("--yes", is_flag=True,
              help="Allow every tool call the model proposes without asking (each is still "
              "logged, gated and sandboxed).")
@click.argument("prompt", nargs=-1)
@click.pass_context
def chat(ctx: click.Context, session_id: str | None, yes: bool, prompt: tuple[str, ...]) -> None:
    """Ask the session's agent: stream its answer and its tool calls, asking before each call.

    With no PROMPT, read one prompt a line from stdin until end of file.
    """
    socket = getattr(ctx.obj, "socket", None)
    text = " ".join(prompt) if prompt else None
    sys.exit(run_chat(socket, session_id, text, yes))
