"""Printing several calls' output from the lane view: ``dsh attach`` of a session where
several calls run (or ``--follow``), and ``dsh attach --approve``.

One call is printed from the raw channel instead (``client.cli.stream``: ``dsh run``,
``dsh attach`` of one call, ``dsh wait``), byte for byte from its first byte.

Theory of operation: each followed call has a ``client.spill.CompleteOutput``; after every
lane batch ``drain`` prints what it has (appends as they come; a window slide or a resubscribe
prints only what is new). Once the output outgrew the window it is copied from the call's
spill file instead, which dshd writes from its own task and so lags the lane a little:
``keep_up`` polls the outputs that are ``behind`` every ``SPILL_POLL_S`` and ``Stalls`` gives
up on a switch to the file that made no progress for ``SPILL_WAIT_S``. When the call settled,
``finish_call`` prints the rest through the result's ``totalBytes`` (``settle_output``), one
closing line when bytes were not shown (and where the complete output is), and the result's
own line; it returns the exit status (``client.exits.exit_status``). A spill file this user
may not read (a system-mode daemon keeps it root's) is not relied on: the window is printed.

``Printer`` puts the output of several calls on one stdout (``dsh attach``): a header on
stderr whenever the call changes, a footer when one settled; ``show_calls`` prints what one
lane batch changed in the calls' output (a header for each new call, followed from the window
first seen on; a footer, after ``tool.wait``, for each that settled).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

import anyio

from client.api import Client
from client.cli.terminal import emit_bytes, fmt_time, note, short
from client.exits import exit_status
from client.spill import CompleteOutput, command_ran
from client.subscription import Subscription
from protocol.lane import ToolResult

__all__ = ["drain", "keep_up", "settle_output", "finish_call", "Printer", "Emit",
           "tools_of", "show_calls", "followed", "Watchers", "SPILL_POLL_S", "SPILL_WAIT_S"]

#: How often an output that waits for its spill file (it lags the lane a little) polls it.
SPILL_POLL_S = 0.02
#: How long a switch to the spill file -- or, after the result, the file -- may make no progress.
SPILL_WAIT_S = 5.0

Emit = Callable[[bytes], None]


def tools_of(view: Any) -> dict[str, Any]:
    tools = view.get("tools") if isinstance(view, dict) else None
    return tools if isinstance(tools, dict) else {}


async def drain(out: CompleteOutput, emit: Emit) -> bool:
    """Print what ``out`` has now (and its notes); True when something was printed."""
    printed = False
    while True:
        data = out.take()
        for line in out.notes:
            note(line)
        out.notes.clear()
        if not data:
            return printed
        emit(data)
        printed = True
        await anyio.sleep(0)  # a flood copied from the spill file must not starve the rest


class Stalls:
    """When each output started waiting for its spill file without progress (``keep_up``)."""

    def __init__(self) -> None:
        self.since: dict[int, float] = {}

    def check(self, out: CompleteOutput, progressed: bool) -> None:
        """Give up on a switch to the spill file that made no progress for SPILL_WAIT_S."""
        key = id(out)
        if progressed or not out.switching:
            self.since.pop(key, None)
            return
        first = self.since.setdefault(key, anyio.current_time())
        if anyio.current_time() - first >= SPILL_WAIT_S:
            out.give_up()
            self.since.pop(key, None)


async def keep_up(outputs: Callable[[], Iterable[tuple[CompleteOutput, Emit]]],
                  lock: anyio.Lock | None = None) -> None:
    """Poll the outputs that wait for their spill file and print what arrived; runs until
    cancelled. ``lock``: held while printing (``dsh attach --approve``: never in the middle of
    a decision)."""
    stalls = Stalls()
    while True:
        await anyio.sleep(SPILL_POLL_S)
        for out, emit in outputs():
            if not out.behind:
                continue
            if lock is not None:
                async with lock:
                    progressed = await drain(out, emit)
            else:
                progressed = await drain(out, emit)
            stalls.check(out, progressed)


async def settle_output(out: CompleteOutput, result: ToolResult, emit: Emit) -> None:
    """Print the rest of a settled call's output: through the result's ``totalBytes`` when
    its spill file is readable (waiting up to SPILL_WAIT_S without progress for it)."""
    out.finish(result)
    stalls = Stalls()
    idle_since = anyio.current_time()
    while True:
        progressed = await drain(out, emit)
        if progressed:
            idle_since = anyio.current_time()
        if not out.behind:
            break
        stalls.check(out, progressed)
        if not out.switching and anyio.current_time() - idle_since >= SPILL_WAIT_S:
            break  # in spill mode and the file stopped short: the closing note says so
        await anyio.sleep(SPILL_POLL_S)
    await drain(out, emit)
    out.close()


def closing_note(out: CompleteOutput, result: ToolResult) -> None:
    """Say how much of the output was not shown, and where all of it is."""
    missing = out.unshown() if command_ran(result) else 0
    if missing <= 0 or out.total is None:
        return
    where = result.details.spill_path
    if out.denied:
        # A system-mode daemon keeps the spill file root's: say so once, and how to read it.
        note(f"dsh: {missing} of {out.total} bytes of output were not shown: the complete "
             f"output is in dshd's state directory, {where}, which only root can read on this "
             f"system (`sudo cat {where}`); a later dsh will stream it through the daemon")
        return
    why = ("the spill file could not supply them" if out.mode != "live"
           else "they scrolled out of the window between two updates")
    note(f"dsh: {missing} of {out.total} bytes of output were not shown ({why})"
         + (f"; the full output is in {where}" if where else ""))


async def finish_call(out: CompleteOutput, result: ToolResult,
                      emit: Emit = emit_bytes) -> int:
    """Print the rest of a settled call and its closing notes; return the exit status."""
    await settle_output(out, result, emit)
    closing_note(out, result)
    status, message = exit_status(result)
    if message:
        note(message)
    return status


def call_header(call_id: str, call: Any) -> str:
    """The bold line before a call's output; a call no longer in the lane (settled) has
    nothing to say but that (its output and result follow)."""
    if not isinstance(call, dict):
        return f"── call {call_id} (settled: its output and result follow)"
    args = call.get("args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    what = args.get("command", args) if isinstance(args, dict) else args
    return (f"── call {call_id} ({call.get('name', '?')}, {call.get('state', 'settled')} since "
            f"{fmt_time(call.get('startedAt'))}): {short(what, 80)}")


def ended_line(call_id: str, result: ToolResult) -> str:
    code = result.exit_code if result.exit_code is not None else result.details.exit_code
    if result.error_code:
        return f"── call {call_id} ended: {result.error_code}" + (
            f" (exit {code})" if isinstance(code, int) else "")
    return f"── call {call_id} exited {code}"


class Printer:
    """Output of several calls on one stdout: a header on stderr whenever the call changes."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.last_byte = b"\n"
        self.headers = 0
        #: The lane entry of each call last seen (for headers).
        self.calls: dict[str, Any] = {}

    def header(self, call_id: str, call: Any) -> None:
        self._newline()
        if call is not None:
            self.calls[call_id] = call
        note(call_header(call_id, self.calls.get(call_id)), "bold")
        self.current = call_id
        self.headers += 1

    def output(self, call_id: str, piece: bytes, call: Any = None) -> None:
        if call is not None:
            self.calls[call_id] = call
        if not piece:
            return
        if self.current != call_id:
            self.header(call_id, call)
        emit_bytes(piece)
        self.last_byte = piece[-1:]

    def emitter(self, call_id: str) -> Emit:
        return lambda piece: self.output(call_id, piece)

    def footer(self, line: str) -> None:
        self._newline()
        note(line, "dim")
        self.current = None

    def _newline(self) -> None:
        if self.last_byte != b"\n":
            emit_bytes(b"\n")
            self.last_byte = b"\n"

    def pause(self) -> None:
        """Something else is shown on the terminal: the next output gets a header again."""
        self._newline()
        self.current = None


#: The outputs being followed, by call id.
Watchers = dict[str, CompleteOutput]


def followed(watchers: Watchers,
             printer: Printer) -> Callable[[], Iterable[tuple[CompleteOutput, Emit]]]:
    """The outputs ``keep_up`` polls: every call followed, printed through ``printer``."""
    return lambda: [(out, printer.emitter(cid)) for cid, out in list(watchers.items())]


async def show_calls(client: Client, session_id: str, sub: Subscription, view: Any,
                     watchers: Watchers, printer: Printer,
                     only: str | None = None) -> tuple[CompleteOutput, ToolResult] | None:
    """Print what one batch changed in the calls' output (module doc). With ``only``, follow
    that call alone and return its output and result once it settled (the caller prints its
    end)."""
    tools = tools_of(view)
    for cid in [only] if only else list(tools):
        if cid in tools and cid not in watchers:
            watchers[cid] = CompleteOutput(cid, from_start=False)
            printer.header(cid, tools[cid])
    for cid, out in list(watchers.items()):
        out.update(sub.mirror.last_ops, view)
        printer.calls[cid] = tools.get(cid, printer.calls.get(cid))
        await drain(out, printer.emitter(cid))
        if not out.settled:
            continue
        del watchers[cid]
        result = await client.wait(session_id, cid)
        if cid == only:
            return out, result
        await settle_output(out, result, printer.emitter(cid))
        printer.footer(ended_line(cid, result))
    return None
