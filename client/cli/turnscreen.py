"""One agent turn on the terminal: what ``dsh chat`` (and ``dsh chat --attach``) prints of it.

Theory of operation: the lane drives the screen (PROTOCOL.md §3.3): the turn's ``text`` (the
current step's assistant text) prints as it grows; the calls the step named (``turn.calls``,
each with its ``state``) print a header on stderr and their live output on stdout while they
are in ``tools``, followed with ``client.follow.CallOutput`` exactly like ``dsh attach``.

A batch may fold several changes together (a short call can come and go between two
publishes), so the log is the referee (its events typed by ``protocol.events``; a call's
``tool/result`` is the ``protocol.lane.ToolResult`` ``tool.wait`` answers): a call whose
lane state is ``settled`` is closed from its ``tool/result`` (its last output, or the sentence
of a call that never ran), and whenever a step ends its ``message/assistant`` prints whatever
of the text the lane did not show. The turn is over when the lane's turn stops being this
one; its ``turn/end`` then says how it ended.

Re-joining a running turn (``dsh chat --attach``) is the same screen started late: the
events from the turn's ``turn/start`` on hold its input (printed first, ``› input``), the
steps that ended (closed from the log in order) and the current step's settled calls; the
lane gives the current step's text so far and its running calls' output windows, then
everything goes on live.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from client.api import Client
from client.follow import CallOutput
from client.spill import command_ran
from protocol.events import (
    AnyEvent, AssistantMessage, AssistantMessageData, ToolCall, ToolResultEvent, TurnEnd,
    TurnEndData, TurnStart, UserMessage,
)
from protocol.lane import ToolResult
from protocol.printable import printable

__all__ = ["TurnScreen", "emit", "note", "command_of", "turn_start_seq"]


def emit(text: str) -> None:
    """Assistant text and tool output: stdout, as is, at once."""
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def note(text: str, *, dim: bool = False) -> None:
    """One line on stderr; what came over the wire in it is shown escaped (``printable``)."""
    text = printable(text, keep="\n\t")
    click.echo(click.style(text, dim=dim) if sys.stderr.isatty() else text, err=True)


def command_of(arguments: Any) -> str:
    """The command of a call's arguments (a JSON string or a value), else their JSON."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    if isinstance(arguments, dict) and isinstance(arguments.get("command"), str):
        return arguments["command"]
    return json.dumps(arguments)


async def turn_start_seq(client: Client, session_id: str, turn_id: str) -> int | None:
    """The seq of ``turn_id``'s ``turn/start`` (None when the log has none)."""
    found = None
    async for event in client.iter_events(session_id):
        if isinstance(event, TurnStart) and event.data.turn_id == turn_id:
            found = event.seq
    return found


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
        #: Calls shown that settled APPROVAL_UNAVAILABLE (no answerer decided them).
        self.unavailable: set[str] = set()
        self._line_start = True

    def open_call(self) -> str | None:
        """The last call shown that has not ended yet (None when there is none)."""
        open_calls = [c for c in self.outputs if c not in self.closed_calls]
        return open_calls[-1] if open_calls else None

    def _text(self, text: str) -> None:
        if text:
            emit(text)
            self._line_start = text.endswith("\n")

    def _newline(self) -> None:
        if not self._line_start:
            emit("\n")
            self._line_start = True

    async def _events(self) -> list[AnyEvent]:
        return [e async for e in self.client.iter_events(self.session_id, self.after_seq)]

    async def replay_input(self) -> None:
        """Re-joining: print the turn's input (its first ``message/user``) on stderr."""
        for e in await self._events():
            if isinstance(e, UserMessage) and e.data.turn_id == self.turn_id:
                note(f"› {e.data.text}", dim=True)
                return

    async def update(self, view: Any, ops: list) -> None:
        turn = view.get("turn") if isinstance(view, dict) else None
        if not (isinstance(turn, dict) and turn.get("turnId") == self.turn_id):
            if self.seen or await self._ended():
                await self.finish()
            return
        self.seen = True
        step = turn.get("stepId")
        events: list[AnyEvent] | None = None
        if step != self.step:
            if step is not None:
                events = await self._events()
                await self.close_steps(events, before=step)
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
        for call in turn.get("calls") or []:
            call_id = call.get("callId") if isinstance(call, dict) else None
            if call_id is None or call_id in self.closed_calls:
                continue
            if call.get("state") == "settled":
                events = events if events is not None else await self._events()
                self.close_call(call_id, events)
                continue
            if call_id not in tools:
                continue
            output = self.outputs.setdefault(call_id, CallOutput(call_id))
            if call_id not in self.headed:
                self._newline()
                entry = tools[call_id]
                note(f"── {entry.get('name')}: {command_of(entry.get('args'))}", dim=True)
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
        for call in answer.tool_calls or []:  # UNSET (no calls) is falsy
            self.close_call(call.call_id, events, call.name, call.arguments)
        self._newline()

    def close_call(self, call_id: str, events: list[AnyEvent], name: str | None = None,
                   arguments: Any = None) -> None:
        """Print a settled call's end from its ``tool/result`` (nothing when it has none yet):
        its header if it had none, what of its output was not shown, how it ended."""
        result: ToolResult | None = None
        for e in events:
            if isinstance(e, ToolResultEvent) and e.data.call_id == call_id:
                result = e.data
            elif name is None and isinstance(e, ToolCall) and e.data.call_id == call_id:
                name, arguments = e.data.name, e.data.arguments
            elif name is None and isinstance(e, AssistantMessage):
                for c in e.data.tool_calls or []:
                    if c.call_id == call_id:
                        name, arguments = c.name, c.arguments
        if call_id in self.closed_calls or result is None:
            return
        self.closed_calls.add(call_id)
        if result.error_code == "APPROVAL_UNAVAILABLE":
            self.unavailable.add(call_id)
        if call_id not in self.headed:
            self._newline()
            note(f"── {name}: {command_of(arguments)}", dim=True)
            self.headed.add(call_id)
        if command_ran(result):
            output = self.outputs.get(call_id)
            truncation = result.details.truncation
            total = truncation.total_bytes if truncation is not None else None
            cut = truncation.truncated if truncation is not None else None
            self._text(output.finish(result.content, total, cut) if output else result.content)
        self._newline()
        code, exit_code = result.error_code, result.exit_code
        if code and not command_ran(result):
            note(f"── not run: {code}: {result.content}", dim=True)
        elif code:
            note(f"── {code}" + (f" (exit {exit_code})" if exit_code is not None else ""),
                 dim=True)
        else:
            note(f"── exit {exit_code}", dim=True)

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
