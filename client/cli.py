"""``dsh``: the command-line client of dshd (click for arguments, rich for the terminal).

Theory of operation: every command is one short trio program over ``client.api.connect``.
A command's own output goes to stdout -- a tool call's output exactly as the command wrote it
(never through rich, never twice), tables and logs as rich tables on a terminal and as plain
tab-separated text otherwise; progress and errors go to stderr. Errors end the command with one
line and a non-zero status: 2 when dshd is not running, 1 for an error answer of the daemon.

``dsh run`` and ``dsh attach`` subscribe to the session's lane view and follow a call's
retained output with ``client.follow.CallOutput``: appends print as they come, a window slide
or a resubscribe prints only what is new. ``dsh run`` exits with the command's exit code
(124 on TOOL_TIMEOUT, 125 when it never ran); Ctrl-C detaches (130) and leaves it running.
The socket is ``--socket``, else ``$DSH_SOCKET``, else the default of ``dshd.paths``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import shlex
import signal
import sys
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import click
import trio
from rich.console import Console
from rich.table import Table
from rich.text import Text

from client.api import Client, DaemonNotRunning, connect, dsh_version
from client.follow import CallOutput
from client.transport import DshClientError
from dshd.paths import is_valid_id
from protocol.rpc import RpcError

__all__ = ["cli", "main", "exit_status", "command_string"]

#: After ``tool.wait`` answered, how long the stream may take to show the call settle.
SETTLE_GRACE_S = 2.0
EXIT_DAEMON_NOT_RUNNING = 2
EXIT_TIMEOUT = 124
EXIT_NEVER_RAN = 125
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


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
    """One line on stderr."""
    _stderr().print(Text(message, style=style or ""))


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
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def command_string(argv: tuple[str, ...] | list[str]) -> str:
    """The shell command for ``argv``: one argument as is (``'make | tee x'``), else shlex.join."""
    return argv[0] if len(argv) == 1 else shlex.join(argv)


def _details(result: dict[str, Any]) -> dict[str, Any]:
    details = result.get("details")
    return details if isinstance(details, dict) else {}


def exit_status(result: dict[str, Any]) -> tuple[int, str | None]:
    """The exit status of ``dsh`` for a ToolResult, and a line for stderr (or None).

    The command's exit code when it has one; 124 for TOOL_TIMEOUT; 125 for a call that never
    ran (its ``errorCode`` and sentence go to stderr); else 1 for an error, 0 otherwise.
    """
    error_code = result.get("errorCode")
    code = result.get("exitCode")
    if not isinstance(code, int):
        code = _details(result).get("exitCode")
    sentence = result.get("message")  # dshd's sentence when content holds output
    if not isinstance(sentence, str):
        sentence = "" if _ran(result) else str(result.get("content") or "")
    sentence = sentence.strip()
    line = (f"dsh: {error_code}: {sentence}" if sentence else f"dsh: {error_code}") if error_code else None
    if error_code == "TOOL_TIMEOUT":
        return EXIT_TIMEOUT, line
    if isinstance(code, int):
        return max(0, min(code, 255)), line
    if error_code:
        return EXIT_NEVER_RAN, line
    return (1 if result.get("isError") else 0), None


def _ran(result: dict[str, Any]) -> bool:
    """True when the command started: its result's content is its output (else a sentence)."""
    details = _details(result)
    return (isinstance(result.get("exitCode"), int) or isinstance(details.get("exitCode"), int)
            or "truncation" in details)


def _result_total_bytes(result: dict[str, Any]) -> int | None:
    truncation = _details(result).get("truncation")
    total = truncation.get("totalBytes") if isinstance(truncation, dict) else None
    return total if isinstance(total, int) else None


def _final_tail(watcher: CallOutput, result: dict[str, Any]) -> str:
    """What the final result adds to the output already printed (nothing if it never ran)."""
    content = result.get("content")
    if not _ran(result) or not isinstance(content, str):
        return ""
    return watcher.finish(content, _result_total_bytes(result))


def _finish_call(watcher: CallOutput, result: dict[str, Any]) -> int:
    """Print the final tail and the closing notes of a settled call; return the exit status."""
    _emit(_final_tail(watcher, result))
    total = _result_total_bytes(result)
    truncation = _details(result).get("truncation")
    if (_ran(result) and isinstance(truncation, dict) and truncation.get("truncated")
            and total is not None and total > watcher.printed_bytes):
        where = _details(result).get("spillPath")
        _note(f"dsh: {total - watcher.printed_bytes} of {total} bytes of output were not shown "
              "(they scrolled out of the window between two updates)"
              + (f"; the full output is in {where}" if where else ""))
    status, message = exit_status(result)
    if message:
        _note(message)
    return status


# ---------------------------------------------------------------------- running commands
@dataclass
class Options:
    socket: str | None
    json: bool = False


def _execute(opts: Options, body: Callable[[Client], Awaitable[int]]) -> int:
    """Connect, run ``body``, map client errors to one stderr line and an exit status."""

    async def main() -> int:
        async with connect(opts.socket) as client:
            return await body(client)

    try:
        return trio.run(main)
    except BaseException as raised:  # noqa: BLE001 - mapped below, re-raised when unknown
        exc = _single(raised)
        if isinstance(exc, DaemonNotRunning):
            _note(str(exc))
            return EXIT_DAEMON_NOT_RUNNING
        if isinstance(exc, DshClientError):
            _note(f"dsh: {exc}")
            return 1
        if isinstance(exc, RpcError):
            _note(f"dsh: {exc.message}")
            return 1
        if isinstance(exc, KeyboardInterrupt):
            return EXIT_INTERRUPTED
        if isinstance(exc, BrokenPipeError):
            _silence_stdout()
            return EXIT_BROKEN_PIPE
        raise


def _single(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (trio nurseries)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _silence_stdout() -> None:
    """After EPIPE, keep the interpreter's final flush of stdout from complaining."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _mint_call_id() -> str:
    return "c" + secrets.token_hex(8)


async def _run(client: Client, argv: tuple[str, ...], session_id: str | None,
               timeout: float | None, call_id: str | None, cancel_on_interrupt: bool) -> int:
    command = command_string(argv)
    if session_id is None:
        session_id = await client.create_session(os.getcwd(), title=command)
    call_id = call_id or _mint_call_id()
    watcher = CallOutput(call_id)
    detached = ""  # why we stopped following before the result: "interrupt" or "pipe"
    cancelling = False
    result: dict[str, Any] | None = None

    # Subscribe first: a command that finishes at once still shows in the lane.
    sub = await client.subscribe(session_id)
    _note(f"session {session_id} call {call_id}")
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
                    nonlocal detached
                    with follow_scope:
                        try:
                            async for view in sub:
                                _emit(watcher.update(sub.mirror.last_ops, view))
                                if watcher.settled:
                                    break
                        except BrokenPipeError:
                            detached = "pipe"
                            nursery.cancel_scope.cancel()
                    follow_done.set()

                nursery.start_soon(on_interrupt)
                await client.run_tool(session_id, command, call_id=call_id, timeout=timeout,
                                      approved=True)
                nursery.start_soon(follow)
                result = await client.wait(session_id, call_id)
                # The lane may show the last output just after the result: give it a moment.
                with trio.move_on_after(SETTLE_GRACE_S):
                    await follow_done.wait()
                follow_scope.cancel()
                nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(1) as cleanup:
            cleanup.shield = True
            await sub.aclose()

    if detached or result is None:
        _note(f"detached; the command keeps running. Re-attach: dsh attach {session_id}")
        if detached == "pipe":
            _silence_stdout()
            return EXIT_BROKEN_PIPE
        return EXIT_INTERRUPTED
    status = _finish_call(watcher, result)
    return EXIT_INTERRUPTED if cancelling else status


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
        self.last_char = "\n"
        self.headers = 0

    def header(self, call_id: str, call: Any) -> None:
        self._newline()
        _note(_call_header(call_id, call), "bold")
        self.current = call_id
        self.headers += 1

    def output(self, call_id: str, piece: str, call: Any) -> None:
        if not piece:
            return
        if self.current != call_id:
            self.header(call_id, call)
        _emit(piece)
        self.last_char = piece[-1]

    def footer(self, line: str) -> None:
        self._newline()
        _note(line, "dim")
        self.current = None

    def _newline(self) -> None:
        if self.last_char != "\n":
            _emit("\n")
            self.last_char = "\n"


async def _attach(client: Client, session_id: str, call_id: str | None, follow: bool) -> int:
    watchers: dict[str, CallOutput] = {}
    printer = _Printer()
    async with await client.subscribe(session_id) as sub:
        first = True
        async for view in sub:
            tools = view.get("tools") if isinstance(view, dict) else None
            tools = tools if isinstance(tools, dict) else {}
            if first and call_id and call_id not in tools:
                # Settled before we came (or unknown): its result says what became of it.
                return _finish_call(CallOutput(call_id), await client.wait(session_id, call_id))
            first = False
            for cid in [call_id] if call_id else list(tools):
                if cid in tools and cid not in watchers:
                    watchers[cid] = CallOutput(cid)
                    printer.header(cid, tools[cid])
            for cid, watcher in list(watchers.items()):
                printer.output(cid, watcher.update(sub.mirror.last_ops, view), tools.get(cid))
                if not watcher.settled:
                    continue
                del watchers[cid]
                result = await client.wait(session_id, cid)
                if cid == call_id:
                    return _finish_call(watcher, result)
                printer.output(cid, _final_tail(watcher, result), None)
                printer.footer(_ended_line(cid, result))
            if not call_id and not watchers and not follow:
                if not printer.headers:
                    _note(f"no call is running in session {session_id}", "dim")
                return 0
    return 0


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


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--session", "session_id", metavar="ID", help="Run in this session (default: a new one).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="Kill the command after S seconds (exit 124).")
@click.option("--call-id", metavar="ID", help="Idempotency key: a call with this id runs once.")
@click.option("--cancel-on-interrupt", is_flag=True,
              help="On Ctrl-C, cancel the command instead of detaching from it.")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
@pass_options
def run(opts: Options, session_id: str | None, timeout: float | None, call_id: str | None,
        cancel_on_interrupt: bool, argv: tuple[str, ...]) -> None:
    """Run CMD in a session and print its output live; exit with its exit code.

    Ctrl-C detaches: the command keeps running (re-attach with `dsh attach SESSION`).
    """
    if call_id is not None and not is_valid_id(call_id):
        raise click.BadParameter("ids match [A-Za-z0-9_-]{1,64}", param_hint="--call-id")
    code = _execute(opts, lambda c: _run(c, argv, session_id, timeout, call_id, cancel_on_interrupt))
    sys.exit(code)


@cli.command()
@click.argument("session_id", metavar="SESSION")
@click.option("--call", "call_id", metavar="ID", help="Follow only this call (exit with its status).")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new calls.")
@pass_options
def attach(opts: Options, session_id: str, call_id: str | None, follow: bool) -> None:
    """Show the running calls of SESSION and their live output."""
    sys.exit(_execute(opts, lambda c: _attach(c, session_id, call_id, follow)))


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
            title = str(s.get("title") or "")
            if s.get("damaged"):
                title = f"DAMAGED ({s['damaged']}) {title}".rstrip()
            cells.append([str(s.get("sessionId", "")), title, str(s.get("cwd", "")),
                          _fmt_time(s.get("createdAt")), str(s.get("running", "")),
                          str(s.get("lastSeq", ""))])
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
@click.option("--after", "after_seq", type=int, default=-1, metavar="N", help="Only events with seq > N.")
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
            _emit(line + "\n")
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
            lines.append(f"{key}: {value}\n")
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
    """Wait for a call's result; print its output and exit with its exit code."""

    async def body(client: Client) -> int:
        result = await client.wait(session_id, call_id, timeout)
        if as_json or opts.json:
            _print_json(result)
            return exit_status(result)[0]
        return _finish_call(CallOutput(call_id), result)

    sys.exit(_execute(opts, body))


def main() -> None:
    """The ``dsh`` entry point."""
    cli.main(prog_name="dsh")


if __name__ == "__main__":  # pragma: no cover
    main()
