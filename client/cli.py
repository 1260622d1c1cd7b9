"""``dsh``: the command-line client of dshd (click for arguments, rich for the terminal).

Theory of operation: every command is one short trio program over ``client.api.connect``.
A command's own output goes to stdout -- a tool call's output exactly as the command wrote it
(never through rich, never twice), tables and logs as rich tables on a terminal and as plain
tab-separated text otherwise; progress and errors go to stderr. Errors end the command with one
line and a non-zero status: 2 when dshd is not running or does not answer ``initialize`` in
time (``DSH_CONNECT_TIMEOUT``), 1 for an error answer of the daemon; when dshd goes away while
``dsh run`` follows a call, a second line says how to learn what became of it (``dsh wait``).

``dsh run`` and ``dsh attach`` subscribe to the session's lane view and follow a call's
retained output with ``client.spill.CompleteOutput``: appends print as they come, a window
slide or a resubscribe prints only what is new (``client.follow.CallOutput``), and once the
output outgrew the window it is copied from the call's spill file instead, so that a flood
the lane could not keep up with still prints every byte once (``_keep_up`` polls the file,
which lags the lane a little; ``dsh run`` prints from the first byte, ``dsh attach`` from the
window it first sees). A spill file this user may not read (a system-mode daemon keeps it
root's) is not relied on: the window is printed, and one closing line says where the complete
output is and how to read it. Metadata that came over the wire -- commands, titles, cwds,
ids, the daemon's messages -- is shown through ``client.output.printable`` (escape sequences
made visible); a call's output is printed as the command wrote it. ``dsh run`` parses its own options strictly (an unknown one is a usage
error) and exits with ``exit_status`` of the result: the command's exit code, 124 on
TOOL_TIMEOUT, 130 for TOOL_CANCELLED with exit 0, 125 when it never ran, 75 when it may or
may not have run (TOOL_OUTCOME_UNKNOWN: dshd crashed while it ran), never 0 for an error;
Ctrl-C detaches (130) and leaves it running. Reusing a ``--call-id`` runs nothing again: a note
says so and the existing call's result is shown.
The socket is ``--socket``, else ``$DSH_SOCKET``, else the default of ``dshd.paths``.

Approvals (PROTOCOL.md §3.4): ``dsh run`` submits pre-approved (the user typed the command);
``dsh run --ask`` does not, and waits for a decision like a model's call would, telling on
stderr how to give it. ``dsh attach --approve`` connects as an answerer and asks y/n on stdin
for each pending request (``client.answer``); ``dsh approve`` decides one from a script. Prompts
and decisions go to stderr: stdout stays the calls' output. ``dsh fsck`` reports each session
as ok / repaired / damaged through the daemon, or reads the logs itself with ``--offline``
(``client.fsck``); it exits 1 when any session is damaged.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import secrets
import shlex
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import click
import trio
from rich.console import Console
from rich.table import Table
from rich.text import Text

from client import fsck as _fsck
from client.answer import LineReader, Outcomes, parse_answer, request_lines
from client.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_NEVER_RAN,
    EXIT_OUTCOME_UNKNOWN,
    EXIT_TIMEOUT,
    exit_for,
    single,
)
from client.api import CallLost, Client, connect, dsh_version
from client.chat import chat as chat_command
from client.output import printable
from client.spill import CompleteOutput, command_ran
from client.transport import ConnectionLost
from dshd.paths import is_valid_id
from dshd.paths import state_dir as resolve_state_dir
from protocol.methods import MAX_TITLE_CHARS
from protocol.rpc import (
    ALREADY_DECIDED,
    APPROVAL_NOT_FOUND,
    STORAGE_FAILURE,
    RpcError,
)

__all__ = ["cli", "main", "exit_status", "command_string"]

#: After ``tool.wait`` answered, how long the stream may take to show the call settle.
SETTLE_GRACE_S = 2.0
#: How often an output that waits for its spill file (it lags the lane a little) polls it.
SPILL_POLL_S = 0.02
#: How long a switch to the spill file -- or, after the result, the file -- may make no progress.
SPILL_WAIT_S = 5.0
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
POLICIES = ("ask", "never")
#: errorCodes of a call that never ran (exit 125 whatever else the result says).
NEVER_RAN_CODES = frozenset({
    "STORAGE_FAILURE", "SANDBOX_UNAVAILABLE", "APPROVAL_REJECTED", "APPROVAL_UNAVAILABLE",
    "APPROVAL_CANCELLED", "ABORTED_BEFORE_DISPATCH", "TOOL_NOT_STARTED",
})
#: Widths of the title and of a damaged session's reason in ``dsh sessions``' table.
TITLE_WIDTH = 60
REASON_WIDTH = 40


# ---------------------------------------------------------------------- output helpers
def _stderr() -> Console:
    return Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def _stdout() -> Console:
    return Console(highlight=False, markup=False, soft_wrap=True)


def _is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _note(message: str, style: str | None = None) -> None:
    """One line on stderr; what came over the wire in it is shown escaped (``printable``)."""
    _stderr().print(Text(printable(message, keep="\n\t"), style=style or ""))


def _emit(text: str) -> None:
    """Write a piece of tool output to stdout, as is, at once."""
    if not text:
        return
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        out.flush()
        buffer.write(text.encode("utf-8", "replace"))
        buffer.flush()
    else:
        out.write(text)
        out.flush()


def _print_json(value: Any) -> None:
    _emit(json.dumps(value, ensure_ascii=False, sort_keys=False) + "\n")


def _fmt_time(ms: Any, *, millis: bool = False) -> str:
    if not isinstance(ms, (int, float)):
        return "-"
    moment = _dt.datetime.fromtimestamp(ms / 1000)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{int(ms) % 1000:03d}" if millis else text


def _short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = printable(text[: 2 * width + 8])
    return text if len(text) <= width else text[: width - 1] + "…"


def _cell(value: Any, width: int | None = None) -> str:
    """A table cell on one line: characters that are not printable (tabs, newlines, ...)
    escaped, and at most ``width`` characters, cut with an ellipsis."""
    text = value if isinstance(value, str) else str(value)
    if width is not None:
        text = text[: 2 * width + 8]  # enough to fill the width: never escape 100 KB for 60
    text = printable(text)
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def command_string(argv: tuple[str, ...] | list[str]) -> str:
    """The shell command for ``argv``: one argument as is (``'make | tee x'``), else shlex.join."""
    return argv[0] if len(argv) == 1 else shlex.join(argv)


def _details(result: dict[str, Any]) -> dict[str, Any]:
    details = result.get("details")
    return details if isinstance(details, dict) else {}


def exit_status(result: dict[str, Any]) -> tuple[int, str | None]:
    """The exit status of ``dsh`` for a ToolResult, and a line for stderr (or None).

    TOOL_TIMEOUT: 124. TOOL_CANCELLED: the command's exit code if non-zero, else 130.
    TOOL_OUTCOME_UNKNOWN (dshd crashed while it ran: it may or may not have run): 75. A code of
    ``NEVER_RAN_CODES``: 125. Another errorCode: the exit code if non-zero, else 1 -- or 125
    when there is none (the call never ran). The ``errorCode`` and sentence go to stderr. No errorCode: the exit code (1 when
    there is none and the result is an error). Never 0 for a result with ``isError``.
    """
    error_code = result.get("errorCode")
    code = result.get("exitCode")
    if not isinstance(code, int) or isinstance(code, bool):
        code = _details(result).get("exitCode")
    if isinstance(code, bool) or not isinstance(code, int):
        code = None
    sentence = result.get("message")  # dshd's sentence when content holds output
    if not isinstance(sentence, str) and error_code == "TOOL_OUTCOME_UNKNOWN":
        # Its content is the sentence, then maybe the last output checkpointed.
        sentence = str(result.get("content") or "").split("\n\n", 1)[0]
    elif not isinstance(sentence, str):
        sentence = "" if _ran(result) else str(result.get("content") or "")
    sentence = sentence.strip()
    line = (f"dsh: {error_code}: {sentence}" if sentence else f"dsh: {error_code}") if error_code else None
    own = max(0, min(code, 255)) if code is not None else None  # what the command exited with
    if error_code == "TOOL_TIMEOUT":
        status = EXIT_TIMEOUT
    elif error_code == "TOOL_CANCELLED":
        status = own or EXIT_INTERRUPTED
    elif error_code == "TOOL_OUTCOME_UNKNOWN":
        status = EXIT_OUTCOME_UNKNOWN
    elif error_code in NEVER_RAN_CODES:
        status = EXIT_NEVER_RAN
    elif error_code:
        status = EXIT_NEVER_RAN if own is None else own or 1
    else:
        status = own if own is not None else 0
    if status == 0 and (error_code or result.get("isError")):
        status = 1
    return status, line


def _ran(result: dict[str, Any]) -> bool:
    """True when the command started: its result's content is its output (else a sentence)."""
    return command_ran(result)


def _emit_bytes(data: bytes) -> None:
    """Write raw tool output to stdout, as is, at once."""
    if not data:
        return
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        out.flush()
        buffer.write(data)
        buffer.flush()
    else:
        out.write(data.decode("utf-8", "replace"))
        out.flush()


async def _drain(out: CompleteOutput, emit: Callable[[bytes], None]) -> bool:
    """Print what ``out`` has now (and its notes); True when something was printed."""
    printed = False
    while True:
        data = out.take()
        for line in out.notes:
            _note(line)
        out.notes.clear()
        if not data:
            return printed
        emit(data)
        printed = True
        await trio.sleep(0)  # a flood copied from the spill file must not starve the rest


class _Stalls:
    """When each output started waiting for its spill file without progress (``_keep_up``)."""

    def __init__(self) -> None:
        self.since: dict[int, float] = {}

    def check(self, out: CompleteOutput, progressed: bool) -> None:
        """Give up on a switch to the spill file that made no progress for SPILL_WAIT_S."""
        key = id(out)
        if progressed or not out.switching:
            self.since.pop(key, None)
            return
        first = self.since.setdefault(key, trio.current_time())
        if trio.current_time() - first >= SPILL_WAIT_S:
            out.give_up()
            self.since.pop(key, None)


async def _keep_up(outputs: Callable[[], list[tuple[CompleteOutput, Callable[[bytes], None]]]],
                   lock: trio.Lock | None = None) -> None:
    """Poll the outputs that wait for their spill file (dshd writes it from its own task: it
    can lag the lane a little) and print what arrived. Runs until cancelled."""
    stalls = _Stalls()
    while True:
        await trio.sleep(SPILL_POLL_S)
        for out, emit in outputs():
            if not out.behind:
                continue
            if lock is not None:
                async with lock:
                    progressed = await _drain(out, emit)
            else:
                progressed = await _drain(out, emit)
            stalls.check(out, progressed)


async def _settle_output(out: CompleteOutput, result: dict[str, Any],
                         emit: Callable[[bytes], None]) -> None:
    """Print the rest of a settled call's output: through the result's ``totalBytes`` when
    its spill file is readable (waiting up to SPILL_WAIT_S without progress for it)."""
    out.finish(result)
    stalls = _Stalls()
    idle_since = trio.current_time()
    while True:
        progressed = await _drain(out, emit)
        if progressed:
            idle_since = trio.current_time()
        if not out.behind:
            break
        stalls.check(out, progressed)
        if not out.switching and trio.current_time() - idle_since >= SPILL_WAIT_S:
            break  # in spill mode and the file stopped short: the closing note says so
        await trio.sleep(SPILL_POLL_S)
    await _drain(out, emit)
    out.close()


def _closing_note(out: CompleteOutput, result: dict[str, Any]) -> None:
    """Say how much of the output was not shown, and where all of it is."""
    missing = out.unshown() if _ran(result) else 0
    if missing <= 0 or out.total is None:
        return
    where = _details(result).get("spillPath")
    if out.denied:
        # A system-mode daemon keeps the spill file root's: say so once, and how to read it.
        _note(f"dsh: {missing} of {out.total} bytes of output were not shown: the complete "
              f"output is in dshd's state directory, {where}, which only root can read on this "
              f"system (`sudo cat {where}`); a later dsh will stream it through the daemon")
        return
    why = ("the spill file could not supply them" if out.mode != "live"
           else "they scrolled out of the window between two updates")
    _note(f"dsh: {missing} of {out.total} bytes of output were not shown ({why})"
          + (f"; the full output is in {where}" if where else ""))


async def _finish_call(out: CompleteOutput, result: dict[str, Any],
                       emit: Callable[[bytes], None] = _emit_bytes) -> int:
    """Print the rest of a settled call and its closing notes; return the exit status."""
    await _settle_output(out, result, emit)
    _closing_note(out, result)
    status, message = exit_status(result)
    if message:
        _note(message)
    return status


# ---------------------------------------------------------------------- running commands
@dataclass
class Options:
    socket: str | None
    json: bool = False


def _execute(opts: Options, body: Callable[[Client], Awaitable[int]], *,
             approvals: bool = False) -> int:
    """Connect, run ``body``, map client errors to one stderr line and an exit status.
    ``approvals``: connect as an approval answerer (PROTOCOL.md §3.4)."""

    async def main() -> int:
        async with connect(opts.socket, approvals=approvals) as client:
            return await body(client)

    try:
        return trio.run(main)
    except BaseException as raised:  # noqa: BLE001 - mapped below, re-raised when unknown
        exc = single(raised)
        if isinstance(exc, BrokenPipeError):
            _silence_stdout()
            return EXIT_BROKEN_PIPE
        code = exit_for(exc, _note)
        if code is None:
            raise
        return code


def _silence_stdout() -> None:
    """After EPIPE, keep the interpreter's final flush of stdout from complaining."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _mint_call_id() -> str:
    return "c" + secrets.token_hex(8)


def _approval_of(view: Any, call_id: str) -> str | None:
    """The id of the pending approval request of ``call_id`` in a lane view, if any."""
    approvals = view.get("approvals") if isinstance(view, dict) else None
    for approval_id, request in (approvals if isinstance(approvals, dict) else {}).items():
        if isinstance(request, dict) and request.get("callId") == call_id:
            return approval_id
    return None


@dataclass
class RunOptions:
    """How ``dsh run`` submits: ``ask`` (not pre-approved) and a new session's settings."""

    ask: bool = False
    sandbox: str | None = None
    policy: str | None = None


async def _run(client: Client, argv: tuple[str, ...], session_id: str | None,
               timeout: float | None, call_id: str | None, cancel_on_interrupt: bool,
               how: RunOptions | None = None) -> int:
    how = how or RunOptions()
    command = command_string(argv)
    if session_id is None:
        session_id = await client.create_session(os.getcwd(), title=_title_of(command),
                                                 sandbox=how.sandbox, approval_policy=how.policy)
    call_id = call_id or _mint_call_id()
    asked = False  # the hint how to approve was given
    waiting: str | None = None  # the approval our call waits for, as the lane last showed
    out = CompleteOutput(call_id)
    detached = ""  # why we stopped following before the result: "interrupt" or "pipe"
    cancelling = False
    result: dict[str, Any] | None = None

    # Subscribe first: a command that finishes at once still shows in the lane.
    sub = await client.subscribe(session_id)
    _note(f"session {session_id} call {call_id}")
    submitted = False  # tool.run was sent: if dshd goes away now, `dsh wait` tells the rest
    try:
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def on_interrupt() -> None:
                    nonlocal detached, cancelling
                    async for _ in signals:
                        if cancel_on_interrupt and not cancelling:
                            cancelling = True
                            _note("dsh: cancelling the command (Ctrl-C again to detach)")
                            try:
                                await client.cancel(session_id, call_id)
                            except RpcError as exc:
                                _note(f"dsh: {exc.message}")
                            continue
                        detached = "interrupt"
                        nursery.cancel_scope.cancel()
                        return

                follow_done = trio.Event()
                follow_scope = trio.CancelScope()

                async def follow() -> None:
                    nonlocal detached, asked, waiting
                    with follow_scope:
                        try:
                            async for view in sub:
                                out.update(sub.mirror.last_ops, view)
                                await _drain(out, _emit_bytes)
                                approval_id = _approval_of(view, call_id) if how.ask else None
                                waiting = approval_id
                                if approval_id and not asked:
                                    asked = True
                                    _note(f"dsh: call {call_id} waits for approval {approval_id}: "
                                          f"answer with `dsh approve {session_id} {approval_id}` "
                                          f"(--reject to refuse) or `dsh attach --approve "
                                          f"{session_id}`")
                                if out.settled:
                                    break
                        except BrokenPipeError:
                            detached = "pipe"
                            nursery.cancel_scope.cancel()
                    follow_done.set()

                async def keep_up() -> None:
                    nonlocal detached
                    try:
                        await _keep_up(lambda: [(out, _emit_bytes)])
                    except BrokenPipeError:
                        detached = "pipe"
                        nursery.cancel_scope.cancel()

                nursery.start_soon(on_interrupt)
                submitted = True
                try:
                    started = await client.start_tool(session_id, command, call_id=call_id,
                                                      timeout=timeout, approved=not how.ask)
                except RpcError as exc:
                    if exc.code != STORAGE_FAILURE:
                        raise
                    # Its tool/call could not be logged: it never ran.
                    _note(f"dsh: STORAGE_FAILURE: {exc.message}")
                    nursery.cancel_scope.cancel()
                    return EXIT_NEVER_RAN
                if isinstance(started, dict) and started.get("existing"):
                    _note(f"dsh: call {call_id} already exists in session {session_id}: showing "
                          "its result; nothing was run again (use a new --call-id to run again)")
                nursery.start_soon(follow)
                nursery.start_soon(keep_up)
                result = await client.wait(session_id, call_id)
                # The lane may show the last output just after the result: give it a moment.
                with trio.move_on_after(SETTLE_GRACE_S):
                    await follow_done.wait()
                follow_scope.cancel()
                nursery.cancel_scope.cancel()
    except BaseException as raised:  # noqa: BLE001 - re-raised, with the hint when dshd left
        lost = single(raised)
        if submitted and isinstance(lost, ConnectionLost) and not isinstance(lost, CallLost):
            raise CallLost(lost, session_id, call_id) from raised
        raise
    finally:
        with trio.move_on_after(1) as cleanup:
            cleanup.shield = True
            await sub.aclose()

    if detached or result is None:
        if waiting:
            _note(f"detached; the call still waits for approval {waiting} (`dsh approve "
                  f"{session_id} {waiting}`). Re-attach: dsh attach {session_id}")
        else:
            _note(f"detached; the command keeps running. Re-attach: dsh attach {session_id}")
        if detached == "pipe":
            _silence_stdout()
            return EXIT_BROKEN_PIPE
        return EXIT_INTERRUPTED
    status = await _finish_call(out, result)
    if result.get("errorCode") == "APPROVAL_UNAVAILABLE":
        _note(f"dsh: keep an answerer attached (`dsh attach --approve --follow {session_id}` in "
              f"another terminal), then run it again with `dsh run --ask --session {session_id}`")
    return EXIT_INTERRUPTED if cancelling else status


def _title_of(command: str) -> str:
    """A new session's title for ``command``: the command, cut to the daemon's cap."""
    if len(command) <= MAX_TITLE_CHARS:
        return command
    return command[: MAX_TITLE_CHARS - 1] + "…"


def _call_header(call_id: str, call: Any) -> str:
    call = call if isinstance(call, dict) else {}
    args = call.get("args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    what = args.get("command", args) if isinstance(args, dict) else args
    return (f"── call {call_id} ({call.get('name', '?')}, {call.get('state', 'settled')} since "
            f"{_fmt_time(call.get('startedAt'))}): {_short(what, 80)}")


def _ended_line(call_id: str, result: dict[str, Any]) -> str:
    code = result.get("exitCode", _details(result).get("exitCode"))
    if result.get("errorCode"):
        return f"── call {call_id} ended: {result['errorCode']}" + (
            f" (exit {code})" if isinstance(code, int) else "")
    return f"── call {call_id} exited {code}"


class _Printer:
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
        _note(_call_header(call_id, self.calls.get(call_id)), "bold")
        self.current = call_id
        self.headers += 1

    def output(self, call_id: str, piece: bytes, call: Any = None) -> None:
        if call is not None:
            self.calls[call_id] = call
        if not piece:
            return
        if self.current != call_id:
            self.header(call_id, call)
        _emit_bytes(piece)
        self.last_byte = piece[-1:]

    def emitter(self, call_id: str) -> Callable[[bytes], None]:
        return lambda piece: self.output(call_id, piece)

    def footer(self, line: str) -> None:
        self._newline()
        _note(line, "dim")
        self.current = None

    def _newline(self) -> None:
        if self.last_byte != b"\n":
            _emit_bytes(b"\n")
            self.last_byte = b"\n"

    def pause(self) -> None:
        """Something else is shown on the terminal: the next output gets a header again."""
        self._newline()
        self.current = None


def _tools_of(view: Any) -> dict[str, Any]:
    tools = view.get("tools") if isinstance(view, dict) else None
    return tools if isinstance(tools, dict) else {}


def _followed(watchers: dict[str, CompleteOutput], printer: _Printer):
    """The outputs ``_keep_up`` polls: every call followed, printed through ``printer``."""
    return lambda: [(out, printer.emitter(cid)) for cid, out in list(watchers.items())]


async def _show_calls(client: Client, session_id: str, sub: Any, view: Any,
                      watchers: dict[str, CompleteOutput], printer: _Printer,
                      only: str | None = None) -> tuple[CompleteOutput, dict[str, Any]] | None:
    """Print what one batch changed in the calls' output: a header for each new call, its new
    output, a footer for each that settled. With ``only``, follow that call alone and return
    its output and result once it settled (the caller prints its end). Each call's output
    is followed from the window first seen on, complete through the spill file."""
    tools = _tools_of(view)
    for cid in [only] if only else list(tools):
        if cid in tools and cid not in watchers:
            watchers[cid] = CompleteOutput(cid, from_start=False)
            printer.header(cid, tools[cid])
    for cid, out in list(watchers.items()):
        out.update(sub.mirror.last_ops, view)
        printer.calls[cid] = tools.get(cid, printer.calls.get(cid))
        await _drain(out, printer.emitter(cid))
        if not out.settled:
            continue
        del watchers[cid]
        result = await client.wait(session_id, cid)
        if cid == only:
            return out, result
        await _settle_output(out, result, printer.emitter(cid))
        printer.footer(_ended_line(cid, result))
    return None


async def _attach(client: Client, session_id: str, call_id: str | None, follow: bool) -> int:
    watchers: dict[str, CompleteOutput] = {}
    printer = _Printer()
    async with await client.subscribe(session_id) as sub:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep_up, _followed(watchers, printer))
            try:
                return await _attach_views(client, session_id, call_id, follow, sub, watchers,
                                           printer)
            finally:
                nursery.cancel_scope.cancel()


async def _attach_views(client: Client, session_id: str, call_id: str | None, follow: bool,
                        sub: Any, watchers: dict[str, CompleteOutput], printer: _Printer) -> int:
    first = True
    async for view in sub:
        if first and call_id and call_id not in _tools_of(view):
            # Settled before we came (or unknown): its result says what became of it.
            result = await client.wait(session_id, call_id)
            return await _finish_call(CompleteOutput(call_id, from_start=False), result)
        first = False
        settled = await _show_calls(client, session_id, sub, view, watchers, printer, call_id)
        if settled is not None:
            return await _finish_call(*settled)
        if not call_id and not watchers and not follow:
            if not printer.headers:
                _note(f"no call is running in session {session_id}", "dim")
            return 0
    return 0


class _StdinClosed(Exception):
    """No answer can come: stdin reached its end while a request waited for one."""


@dataclass
class _Answering:
    """The answerer's state shared by its tasks (see ``_attach_approve``)."""

    #: The approvals of the last view: pending requests, by id.
    live: dict[str, Any] = field(default_factory=dict)
    #: Ids ever queued (each request is shown once).
    seen: set[str] = field(default_factory=set)
    #: Queued or being answered, not finished yet.
    unfinished: int = 0
    #: The request being prompted for, and the scope of the prompt (cancelled when the request
    #: leaves the lane: decided elsewhere).
    current: str | None = None
    prompt: trio.CancelScope | None = None
    #: ``following`` is handling a batch (it checks for the end itself afterwards).
    showing: bool = False
    #: Held while a decision is on its way, so that the call's output shows after its outcome.
    deciding: trio.Lock = field(default_factory=trio.Lock)
    asked: int = 0
    status: int = 0


async def _attach_approve(client: Client, session_id: str, follow: bool, *,
                          stdin_fd: int = 0) -> int:
    """``dsh attach --approve``: like ``dsh attach`` (all calls), and answer every approval
    request of the session with y/n from stdin, one at a time, in the order they came.

    The sandbox mode shown is SessionInfo's (``session.get``, asked per request), else the
    lane's. Three tasks: ``following`` mirrors the lane, prints the calls' output, queues new
    requests and ends the prompt of one that left the lane (decided elsewhere: it says so);
    ``answering`` shows each queued request, reads the answer and sends ``approval.decide``
    (holding ``deciding`` until the outcome is printed, so the call's output never comes before
    it); the stdin reader. Without ``--follow`` it ends once no call is in the lane, no request
    is pending and none is being answered.
    """
    start = await client.get_session(session_id)
    outcomes = Outcomes(client, session_id, int(start.get("lastSeq", -1)))
    provider = client.server.get("sandbox") if isinstance(client.server, dict) else None
    reader = LineReader(stdin_fd)
    watchers: dict[str, CompleteOutput] = {}
    printer = _Printer()
    state = _Answering()
    send, receive = trio.open_memory_channel[str](math.inf)
    mode: Any = None

    async def gone(approval_id: str) -> None:
        outcome = await outcomes.lookup(approval_id)
        _note(f"── approval {approval_id} was decided elsewhere: "
              f"{outcome or 'no longer pending'}", "bold")

    async def decide(approval_id: str, decision: str) -> None:
        try:
            outcome = await client.decide(session_id, approval_id, decision)
        except RpcError as exc:
            if exc.code == ALREADY_DECIDED:
                done = exc.data.get("outcome") if isinstance(exc.data, dict) else None
                _note(f"── approval {approval_id} was already decided elsewhere: {done}", "bold")
                return
            if exc.code == APPROVAL_NOT_FOUND:
                _note(f"── approval {approval_id} is gone: {exc.message}", "bold")
                return
            raise
        _note(f"── approval {approval_id}: {outcome}", "bold")

    async def sandbox_mode() -> Any:
        # SessionInfo's mode is the one calls run under; the lane's ``session.sandbox`` is
        # the fallback (dshd's lane has shown the config default instead of the mode given to
        # session.create: the person deciding must see the real one).
        try:
            info = await client.get_session(session_id)
        except RpcError:
            info = {}
        return info.get("sandbox") or mode

    async def answer(approval_id: str) -> None:
        run_mode = await sandbox_mode() if approval_id in state.live else None
        if approval_id not in state.live:
            await gone(approval_id)  # decided before its turn came
            return
        printer.pause()
        state.asked += 1
        lines = request_lines(session_id, approval_id, state.live[approval_id], run_mode,
                              provider)
        _note(lines[0], "bold")
        for line in lines[1:]:
            _note(line)
        decision: str | None = None
        with trio.CancelScope() as prompt:
            state.current, state.prompt = approval_id, prompt
            since = trio.current_time()
            while decision is None:
                _stderr().print(Text("allow it once? [y/n] ", style="bold"), end="")
                line = await reader.line(since)
                if line is None:
                    _stderr().print()
                    raise _StdinClosed(approval_id)
                if not reader.tty:
                    _stderr().print(Text(printable(line)))  # a transcript reads like the session did
                decision = parse_answer(line)
                if decision is None:
                    _note("answer y (allow it once) or n (reject it)")
                    since = trio.current_time()
        state.current, state.prompt = None, None
        if decision is None:  # the prompt was ended: ``following`` said why
            return
        async with state.deciding:
            await decide(approval_id, decision)

    async with await client.subscribe(session_id) as sub:
        async with trio.open_nursery() as nursery:

            def maybe_done() -> None:
                if follow or state.showing or watchers or state.live or state.unfinished:
                    return
                if not printer.headers and not state.asked:
                    _note(f"no call is running and no approval is pending in session {session_id}",
                          "dim")
                nursery.cancel_scope.cancel()

            async def answering() -> None:
                async for approval_id in receive:
                    try:
                        await answer(approval_id)
                    except _StdinClosed:
                        _note(f"dsh: stdin is closed, so nobody can answer approval {approval_id} "
                              "here; detaching (another answerer may decide it, else it ends "
                              "unavailable)")
                        state.status = 1
                        nursery.cancel_scope.cancel()
                        return
                    state.unfinished -= 1
                    maybe_done()

            async def following() -> None:
                nonlocal mode
                async for view in sub:
                    state.showing = True
                    session = view.get("session") if isinstance(view, dict) else None
                    if isinstance(session, dict):
                        mode = session.get("sandbox", mode)
                    approvals = view.get("approvals") if isinstance(view, dict) else None
                    state.live = dict(approvals) if isinstance(approvals, dict) else {}
                    if state.prompt is not None and state.current not in state.live:
                        state.prompt.cancel()
                        state.prompt = None
                        _stderr().print()  # end the prompt's line
                        await gone(str(state.current))
                    async with state.deciding:
                        await _show_calls(client, session_id, sub, view, watchers, printer)
                    for approval_id in state.live:
                        if approval_id not in state.seen:
                            state.seen.add(approval_id)
                            state.unfinished += 1
                            send.send_nowait(approval_id)
                    state.showing = False
                    maybe_done()

            nursery.start_soon(reader.run)
            nursery.start_soon(answering)
            nursery.start_soon(following)
            nursery.start_soon(_keep_up, _followed(watchers, printer), state.deciding)
    return state.status


# ---------------------------------------------------------------------- the commands
pass_options = click.make_pass_decorator(Options)


def _json_flag(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(func)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", metavar="PATH", envvar="DSH_SOCKET",
              help="dshd's socket (default: $DSH_SOCKET, else the user socket).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON where a command can.")
@click.version_option(dsh_version(), prog_name="dsh", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, socket_path: str | None, as_json: bool) -> None:
    """dsh: run commands in dshd sessions that outlive the terminal."""
    ctx.obj = Options(socket=socket_path or None, json=as_json)


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--session", "session_id", metavar="ID", help="Run in this session (default: a new one).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="Kill the command after S seconds (exit 124).")
@click.option("--call-id", metavar="ID", help="Idempotency key within a session: with --session, a call with this id runs once (without --session every run makes a new session, so the key protects nothing).")
@click.option("--cancel-on-interrupt", is_flag=True,
              help="On Ctrl-C, cancel the command instead of detaching from it.")
@click.option("--ask", is_flag=True,
              help="Do not pre-approve: wait for an answerer's decision, like a model's call.")
@click.option("--sandbox", type=click.Choice(SANDBOX_MODES), default=None,
              help="Sandbox mode of the new session (default: the daemon's config).")
@click.option("--policy", type=click.Choice(POLICIES), default=None,
              help="Approval policy of the new session (default: the daemon's config).")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
@pass_options
def run(opts: Options, session_id: str | None, timeout: float | None, call_id: str | None,
        cancel_on_interrupt: bool, ask: bool, sandbox: str | None, policy: str | None,
        argv: tuple[str, ...]) -> None:
    """Run CMD in a session and print its output live; exit with its exit code.

    Options come first: everything after `--` (or from the first word that is not an option)
    is the command; an unknown option is an error. The output is printed complete, even when
    it outruns the live window: from then on it is copied byte for byte from the call's spill
    file. Output that fits the window is dshd's cleaned text (NUL and control characters other
    than tab, newline and ESC dropped; invalid UTF-8 shown as U+FFFD).
    Ctrl-C detaches: the command keeps running (re-attach with `dsh attach SESSION`).

    \b
    Exit status (never 0 when the call is an error):
      N    the command's exit code
      124  TOOL_TIMEOUT: killed after --timeout
      130  TOOL_CANCELLED and the command exited 0 (else its own code);
           Ctrl-C (detached, or --cancel-on-interrupt)
      125  the call did not run (--ask and rejected, nobody to ask, no sandbox,
           STORAGE_FAILURE, TOOL_NOT_STARTED, ...)
      75   TOOL_OUTCOME_UNKNOWN: dshd crashed while it ran; it may or may not
           have run (check before retrying); also when dshd went away under
           dsh run (after a restart, `dsh wait SESSION CALL` tells)
      1    any other errorCode with exit code 0; a request refused by dshd
           (e.g. a session directory you cannot enter)
      2    a usage error, or dshd is not running (or does not answer)
      141  stdout was closed (detached)
    """
    if call_id is not None and not is_valid_id(call_id):
        raise click.BadParameter("ids match [A-Za-z0-9_-]{1,64}", param_hint="--call-id")
    if session_id is not None and (sandbox or policy):
        raise click.UsageError("--sandbox and --policy set up a new session, not with --session "
                               "(`dsh policy SESSION ask|never` changes a session's policy)")
    how = RunOptions(ask=ask, sandbox=sandbox, policy=policy)
    code = _execute(opts, lambda c: _run(c, argv, session_id, timeout, call_id,
                                         cancel_on_interrupt, how))
    sys.exit(code)


@cli.command()
@click.argument("session_id", metavar="SESSION")
@click.option("--call", "call_id", metavar="ID", help="Follow only this call (exit with its status).")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new calls.")
@click.option("--approve", is_flag=True,
              help="Answer the session's approval requests: y/n for each, read from stdin.")
@pass_options
def attach(opts: Options, session_id: str, call_id: str | None, follow: bool,
           approve: bool) -> None:
    """Show the running calls of SESSION and their live output.

    With --approve, also show each pending approval request (the exact command, the call and
    the sandbox it would run in) and answer it with y or n on stdin. Without --follow it ends
    once no call runs and no request is pending; a closed stdin with a request unanswered
    detaches with status 1.
    """
    if approve and call_id:
        raise click.UsageError("--approve answers for the whole session: not with --call")
    if approve:
        sys.exit(_execute(opts, lambda c: _attach_approve(c, session_id, follow), approvals=True))
    sys.exit(_execute(opts, lambda c: _attach(c, session_id, call_id, follow)))


@cli.command()
@click.argument("session_id", metavar="SESSION")
@click.argument("approval_id", metavar="APPROVAL")
@click.option("--reject", is_flag=True, help="Reject the call (default: allow it once).")
@_json_flag
@pass_options
def approve(opts: Options, session_id: str, approval_id: str, reject: bool, as_json: bool) -> None:
    """Allow (or --reject) a pending approval request; print the outcome.

    Exit 1 when it was already decided ("already decided: OUTCOME") or is unknown.
    """

    async def body(client: Client) -> int:
        try:
            outcome = await client.decide(session_id, approval_id, "reject" if reject else "allow")
        except RpcError as exc:
            if exc.code != ALREADY_DECIDED:
                raise
            done = exc.data.get("outcome") if isinstance(exc.data, dict) else None
            if as_json or opts.json:
                _print_json({"outcome": done, "alreadyDecided": True})
            _note(f"dsh: approval {approval_id} already decided: {done}")
            return 1
        if as_json or opts.json:
            _print_json({"outcome": outcome})
        else:
            _emit(f"{printable(str(outcome))}\n")
        return 0

    sys.exit(_execute(opts, body))


@cli.command()
@click.argument("session_id", metavar="SESSION")
@click.argument("policy", type=click.Choice(POLICIES), metavar="ask|never")
@_json_flag
@pass_options
def policy(opts: Options, session_id: str, policy: str, as_json: bool) -> None:
    """Set the approval policy of SESSION: ask (wait for an answerer) or never (reject)."""

    async def body(client: Client) -> int:
        await client.set_policy(session_id, policy)
        if as_json or opts.json:
            _print_json({"sessionId": session_id, "approvalPolicy": policy})
        else:
            _note(f"session {session_id}: approval policy {policy}")
        return 0

    sys.exit(_execute(opts, body))


@cli.command()
@_json_flag
@pass_options
def sessions(opts: Options, as_json: bool) -> None:
    """List the sessions."""

    async def body(client: Client) -> int:
        rows = await client.list_sessions()
        if as_json or opts.json:
            _print_json(rows)
            return 0
        headers = ["id", "title", "cwd", "created", "running", "lastSeq"]
        cells = []
        for s in rows:
            title = _cell(s.get("title") or "", TITLE_WIDTH)
            if s.get("damaged"):
                title = f"DAMAGED ({_cell(s['damaged'], REASON_WIDTH)}) {title}".rstrip()
            cells.append([_cell(s.get("sessionId", "")), title, _cell(s.get("cwd", "")),
                          _fmt_time(s.get("createdAt")), _cell(s.get("running", "")),
                          _cell(s.get("lastSeq", ""))])
        if _is_tty():
            table = Table(*headers, box=None, header_style="bold")
            for row, s in zip(cells, rows):
                table.add_row(*row, style="red" if s.get("damaged") else None)
            _stdout().print(table)
        else:
            _emit("".join("\t".join(r) + "\n" for r in [headers, *cells]))
        return 0

    sys.exit(_execute(opts, body))


@cli.command()
@click.argument("session_id", metavar="SESSION")
@click.option("--after", "after_seq", type=click.IntRange(min=-1), default=-1, metavar="N",
              help="Only events with seq > N (default: all).")
@_json_flag
@pass_options
def log(opts: Options, session_id: str, after_seq: int, as_json: bool) -> None:
    """Print the durable events of SESSION, one a line."""

    async def body(client: Client) -> int:
        async for event in client.iter_events(session_id, after_seq):
            if as_json or opts.json:
                _print_json(event)
                continue
            line = (f"{event.get('seq', '?'):>6}  {_fmt_time(event.get('time'), millis=True)}  "
                    f"{str(event.get('type', '?')):<17} {_short(event.get('data'))}")
            _emit(printable(line) + "\n")
        return 0

    sys.exit(_execute(opts, body))


@cli.command()
@click.argument("session_id", metavar="SESSION")
@click.argument("call_id", metavar="CALL")
@_json_flag
@pass_options
def cancel(opts: Options, session_id: str, call_id: str, as_json: bool) -> None:
    """Cancel a running call (exit 1 when it was not running)."""

    async def body(client: Client) -> int:
        cancelled = await client.cancel(session_id, call_id)
        if as_json or opts.json:
            _print_json({"cancelled": cancelled})
        else:
            _note(f"call {call_id} cancelled" if cancelled else f"call {call_id} was not running")
        return 0 if cancelled else 1

    sys.exit(_execute(opts, body))


@cli.command()
@_json_flag
@pass_options
def status(opts: Options, as_json: bool) -> None:
    """Show the daemon's status."""

    async def body(client: Client) -> int:
        info = await client.status()
        if as_json or opts.json:
            _print_json(info)
            return 0
        lines = []
        for key, value in info.items():
            if key == "startedAt":
                value = _fmt_time(value)
            elif isinstance(value, (dict, list)):
                value = json.dumps(value, separators=(", ", ": "))
            lines.append(printable(f"{key}: {value}") + "\n")
        _emit(f"socket: {client.socket_path}\n" + "".join(lines))
        return 0

    sys.exit(_execute(opts, body))


@cli.command()
@click.argument("session_id", metavar="SESSION")
@click.argument("call_id", metavar="CALL")
@click.option("--timeout", type=click.FloatRange(min=0), metavar="S",
              help="Give up waiting after S seconds (the call keeps running).")
@_json_flag
@pass_options
def wait(opts: Options, session_id: str, call_id: str, timeout: float | None, as_json: bool) -> None:
    """Wait for a call's result; print its output and exit with its exit code.

    \b
    Exit status (never 0 when the call is an error):
      N    the command's exit code
      124  TOOL_TIMEOUT: killed after its timeout
      130  TOOL_CANCELLED and the command exited 0 (else its own code)
      125  the call did not run (rejected, no sandbox, STORAGE_FAILURE,
           TOOL_NOT_STARTED, ...)
      75   TOOL_OUTCOME_UNKNOWN: dshd crashed while it ran; it may or may not
           have run (check before retrying)
      1    any other errorCode with exit code 0, or an error answer (e.g. --timeout
           passed: the call keeps running)
      2    a usage error, or dshd is not running (or does not answer)
    """

    async def body(client: Client) -> int:
        result = await client.wait(session_id, call_id, timeout)
        if as_json or opts.json:
            _print_json(result)
            return exit_status(result)[0]
        return await _finish_call(CompleteOutput(call_id, opener=None), result)

    sys.exit(_execute(opts, body))


_FSCK_STYLES = {"ok": "green", "repaired": "yellow", "torn": "yellow", "needs-repair": "yellow",
                "damaged": "bold red", "unchecked": "red"}
_RUN_FSCK = " (run `dsh fsck`)"


async def _fsck_online(client: Client, session_id: str | None,
                       report: Callable[[_fsck.Verdict], None]) -> None:
    """Judge the sessions through dshd (``client.fsck``): list, then open each one."""
    rows = await client.list_sessions()
    if session_id is not None:
        rows = [r for r in rows if r.get("sessionId") == session_id]
        if not rows:
            await client.get_session(session_id)  # the daemon's own "not found" error
            rows = [{"sessionId": session_id, "lastSeq": None}]
    for row in rows:
        sid = str(row.get("sessionId"))
        damaged = row.get("damaged")
        if damaged:
            reason = str(damaged)
            reason = reason[: -len(_RUN_FSCK)] if reason.endswith(_RUN_FSCK) else reason
            report(_fsck.Verdict(sid, "damaged", reason))
            continue
        try:
            info = await client.get_session(sid)  # opens it: a crashed session is repaired now
        except RpcError as exc:
            state = "damaged" if exc.code == STORAGE_FAILURE else "unchecked"
            report(_fsck.Verdict(sid, state, exc.message))
            continue
        before, after = row.get("lastSeq"), info.get("lastSeq")
        repairs: list[str] = []
        if isinstance(before, int) and isinstance(after, int) and after > before:
            repairs = _fsck.repairs_in([e async for e in client.iter_events(sid, before)])
        report(_fsck.Verdict(sid, "repaired" if repairs else "ok", repairs=repairs))


def _fsck_offline(state_dir: str | None, session_id: str | None,
                  report: Callable[[_fsck.Verdict], None]) -> int | None:
    """Judge the sessions from their logs (never writes); an exit status on a usage error."""
    root = resolve_state_dir(state_dir)
    try:
        ids = _fsck.offline_ids(root, session_id)
    except (FileNotFoundError, ValueError) as exc:
        _note(f"dsh: {exc.strerror}: {exc.filename}" if isinstance(exc, OSError) else f"dsh: {exc}")
        return 1
    if _fsck.daemon_holds(root):
        _note(f"dsh: a running dshd holds {root}: a log it is writing may look torn, and its "
              "running calls show as needing repair")
    for sid in ids:
        report(_fsck.check_offline(root, sid))
    return None


@cli.command()
@click.argument("session_id", metavar="[SESSION]", required=False)
@click.option("--offline", is_flag=True,
              help="Read the logs directly, without dshd (never writes; dshd need not run).")
@click.option("--state-dir", "state_dir", metavar="DIR", default=None,
              help="With --offline: the state directory (default: $DSH_STATE_DIR, else the "
                   "user's).")
@_json_flag
@pass_options
def fsck(opts: Options, session_id: str | None, offline: bool, state_dir: str | None,
         as_json: bool) -> None:
    """Check the sessions' logs: ok, repaired, or damaged (exit 1 when any is damaged).

    Through dshd, opening a session repairs it after a crash (calls that never settled get
    TOOL_OUTCOME_UNKNOWN or TOOL_NOT_STARTED results, pending approvals are cancelled): fsck
    says what was repaired. --offline reads the logs itself and reports torn tails (the records
    recovered), damage (its byte offset) and what the daemon would repair.
    """
    if state_dir is not None and not offline:
        raise click.UsageError("--state-dir is for --offline (dshd knows its own state directory)")
    verdicts: list[_fsck.Verdict] = []
    to_json = as_json or opts.json
    tty = _is_tty()

    def report(verdict: _fsck.Verdict) -> None:
        verdicts.append(verdict)
        if to_json:
            return
        line = printable(f"{verdict.session_id}") + "\t" + printable(verdict.text())
        if tty:
            _stdout().print(Text(line, style=_FSCK_STYLES.get(verdict.state, "")))
        else:
            _emit(line + "\n")

    if offline:
        try:
            code = _fsck_offline(state_dir, session_id, report)
        except BrokenPipeError:
            _silence_stdout()
            sys.exit(EXIT_BROKEN_PIPE)
        if code is not None:
            sys.exit(code)
    else:
        code = _execute(opts, lambda c: _fsck_online(c, session_id, report))
        if code:
            sys.exit(code)
    if to_json:
        _print_json([v.to_json() for v in verdicts])
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict.state] = counts.get(verdict.state, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    _note(f"fsck: {len(verdicts)} session{'' if len(verdicts) == 1 else 's'}"
          + (f": {summary}" if summary else ""), "dim")
    sys.exit(1 if any(v.failed for v in verdicts) else 0)


cli.add_command(chat_command)


def main() -> None:
    """The ``dsh`` entry point."""
    cli.main(prog_name="dsh")


if __name__ == "__main__":  # pragma: no cover
    main()
