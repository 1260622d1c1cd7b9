"""The commands that show what dshd holds, and the one-call commands: ``dsh sessions``,
``dsh rename``, ``dsh status``, ``dsh wait``, ``dsh cancel`` (``dsh log``: ``logshow``).

Theory of operation: each is one request (or one page walk) and prints its answer: as JSON
with ``--json`` (the result struct encoded as on the wire), else as text -- a rich table on a
terminal, columns of plain text aligned by terminal cells otherwise (:func:`aligned`), every
cell on one line and cut to a width (``client.cli.terminal.cell``). A session argument is a
reference (``client.cli.sessionref``: an id, a name, a unique prefix; ``dsh wait`` without
one takes the newest session of the current directory). ``dsh status`` says the sandbox in
words (:func:`sandbox_words`). ``dsh wait`` prints the call's complete output once it
settled -- every retained byte, from the raw channel (``client.cli.stream.replay``), not the
result's window -- and exits with the call's status (``client.exits``); a ``--timeout`` that
passes first exits 124 (``EXIT_TIMEOUT``) with a line saying the call still runs.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
import msgspec
from msgspec import UNSET
from rich.cells import cell_len
from rich.table import Table

from client.api import CallLost, Client
from client.cli.common import (
    Options, execute, execute_linked, json_flag, pass_options, reconnect_option,
)
from client.cli.stream import Call, Followed, OutputState, replay, result_status, wait_result
from client.link import Link, ride
from client.transport import ConnectionLost
from client.cli.terminal import cell, emit, fmt_time, is_tty, note, print_json, stdout
from client.exits import EXIT_TIMEOUT, decided_status, exit_status
from client.cli.sessionref import SESSION_REF, resolve_session
from protocol.names import NAME_CHARS, is_valid_name
from protocol.rpc import TIMEOUT, RpcError
from protocol.printable import printable
from client.spill import command_ran
from protocol.methods import CancelledResult, SessionInfo

__all__ = ["sessions", "rename", "status", "wait", "cancel", "TITLE_WIDTH", "REASON_WIDTH",
           "aligned", "sandbox_words", "session_status"]

#: Widths of the title and of a damaged session's reason in ``dsh sessions``' table.
TITLE_WIDTH = 60
REASON_WIDTH = 40
HEADERS = ["NAME", "ID", "STATUS", "CWD", "UPDATED", "EXIT", "TITLE"]


def _given(value: Any, default: Any = "") -> Any:
    """A field's value, ``default`` when the session has none (``UNSET``: a damaged one)."""
    return default if value is UNSET or value is None else value


def session_status(s: SessionInfo) -> str:
    """``damaged``, ``unreadable`` (dshd could not look now: out of fds), ``waiting approval``
    (N), ``running N`` or ``idle``."""
    if s.damaged:
        return "damaged"
    if s.unreadable:
        return "unreadable"
    pending, running = _given(s.pending_approvals, 0), _given(s.running, 0)
    if pending:
        return "waiting approval" + (f" ({pending})" if pending > 1 else "")
    return f"running {running}" if running else "idle"


def _session_row(s: SessionInfo) -> list[str]:
    title = cell(_given(s.title), TITLE_WIDTH)
    if s.damaged or s.unreadable:
        title = f"({cell(s.damaged or s.unreadable, REASON_WIDTH)}) {title}".rstrip()
    return [cell(_given(s.name, "-")), cell(s.session_id), session_status(s), cell(_given(s.cwd)),
            fmt_time(_given(s.updated_at, _given(s.created_at, None))),
            cell(_given(s.last_exit, "-")), title]


def aligned(rows: list[list[str]]) -> str:
    """Rows as plain text in columns (two spaces apart; widths in terminal cells)."""
    widths = [max(cell_len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("  ".join(c + " " * (w - cell_len(c)) for c, w in zip(r, widths)).rstrip()
                   + "\n" for r in rows)


@click.command()
@json_flag
@pass_options
def sessions(opts: Options, as_json: bool) -> None:
    """List the sessions, newest last: name, id, status, cwd, updated, last exit, title.

    \b
    STATUS is one of: idle, running N (N calls not settled), waiting approval,
    damaged (the log cannot be read: `dsh fsck`). EXIT is the newest settled
    call's exit code or error code. --json prints the SessionInfo list.
    """

    async def body(client: Client) -> int:
        rows = sorted(await client.list_sessions(),
                      key=lambda s: (_given(s.updated_at, 0), s.session_id))
        if as_json or opts.json:
            print_json(rows)
            return 0
        cells = [_session_row(s) for s in rows]
        if is_tty():
            table = Table(*HEADERS, box=None, header_style="bold")
            for row, s in zip(cells, rows):
                table.add_row(*row, style="red" if s.damaged else None)
            stdout().print(table)
        else:
            emit(aligned([HEADERS, *cells]))
        return 0

    sys.exit(execute(opts, body))


@click.command()
@click.argument("ref", metavar="SESSION", type=SESSION_REF)
@click.argument("name", required=False)
@click.option("--clear", is_flag=True, help="Remove the session's name.")
@json_flag
@pass_options
def rename(opts: Options, ref: str, name: str | None, clear: bool, as_json: bool) -> None:
    """Give SESSION the name NAME (unique among your sessions), or --clear it.

    NAME: a letter or digit, then up to 63 of letters, digits, '.', '_', '-'."""
    if (name is None) == (not clear):
        raise click.UsageError("give a NAME, or --clear (not both)")
    if name is not None and not is_valid_name(name):
        raise click.BadParameter(f"{name!r} is not a session name ({NAME_CHARS})",
                                 param_hint="NAME")

    async def body(client: Client) -> int:
        session_id = await resolve_session(client, ref)
        await client.rename_session(session_id, name)
        if as_json or opts.json:
            print_json({"sessionId": session_id, "name": name})
        else:
            note(f"dsh: session {session_id} is now named {name}" if name
                 else f"dsh: session {session_id} has no name now")
        return 0

    sys.exit(execute(opts, body))


@click.command()
@click.argument("ref", metavar="SESSION", type=SESSION_REF)
@click.argument("call_id", metavar="CALL")
@json_flag
@pass_options
def cancel(opts: Options, ref: str, call_id: str, as_json: bool) -> None:
    """Cancel a running call (exit 1 when it was not running)."""

    async def body(client: Client) -> int:
        session_id = await resolve_session(client, ref)
        cancelled = await client.cancel(session_id, call_id)
        if as_json or opts.json:
            print_json(CancelledResult(cancelled=cancelled))
        else:
            note(f"call {call_id} cancelled" if cancelled else f"call {call_id} was not running")
        return decided_status(already=not cancelled)

    sys.exit(execute(opts, body))


#: How ``dsh status`` words a sandbox's completeness (``daemon.status`` ``sandbox``).
COMPLETENESS = {"full": "full confinement", "partial": "partial confinement",
                "none": "NO confinement"}


def sandbox_words(sandbox: dict) -> list[str]:
    """The daemon's sandbox as lines a person reads (``dsh status``)."""
    provider = str(sandbox.get("provider", "?"))
    completeness = str(sandbox.get("completeness", "?"))
    lines = [f"sandbox: {provider}, {COMPLETENESS.get(completeness, completeness)}"]
    if sandbox.get("reason"):
        lines.append(f"  {sandbox['reason']}")
    skipped = sandbox.get("skipped") or []
    if skipped:
        lines.append("  not applied: " + "; ".join(
            s if isinstance(s, str) else json.dumps(s, separators=(", ", ": "))
            for s in skipped))
    return lines


@click.command()
@json_flag
@pass_options
def status(opts: Options, as_json: bool) -> None:
    """Show the daemon's status (--json: daemon.status as JSON)."""

    async def body(client: Client) -> int:
        info = await client.status()
        if as_json or opts.json:
            print_json(info)
            return 0
        lines = []
        for key, value in msgspec.to_builtins(info).items():
            if key == "sandbox" and isinstance(value, dict):
                lines += sandbox_words(value)
                continue
            if key == "startedAt":
                value = fmt_time(value)
            elif isinstance(value, (dict, list)):
                value = json.dumps(value, separators=(", ", ": "))
            lines.append(f"{key}: {value}")
        emit(f"socket: {client.socket_path}\n" + "".join(printable(x) + "\n" for x in lines))
        return 0

    sys.exit(execute(opts, body))


def session_and_call(refs: tuple[str, ...]) -> tuple[str | None, str]:
    """``[SESSION] CALL`` of ``dsh wait`` (a usage error for any other count)."""
    if len(refs) not in (1, 2):
        raise click.UsageError("give CALL, or SESSION CALL")
    return (None, refs[0]) if len(refs) == 1 else (refs[0], refs[1])


def _complete_first(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """Complete sessions at the first of ``[SESSION] CALL``, nothing after it."""
    if ctx.params.get(param.name or ""):
        return []
    return SESSION_REF.shell_complete(ctx, param, incomplete)


@click.command()
@click.argument("refs", metavar="[SESSION] CALL", nargs=-1, required=True,
                shell_complete=_complete_first)
@click.option("--timeout", type=click.FloatRange(min=0, max=86400), metavar="S",
              help="Give up waiting after S seconds: exit 124, the call keeps running.")
@reconnect_option
@json_flag
@pass_options
def wait(opts: Options, refs: tuple[str, ...], timeout: float | None,
         reconnect_timeout: float, as_json: bool) -> None:
    """Wait for a call's result; print its complete output and exit with its exit code.

    \b
    SESSION: an id, a name or a unique prefix; without it, the newest session
    of the current directory (said on stderr).

    \b
    Exit status (never 0 when the call is an error):
      N    the command's exit code
      124  TOOL_TIMEOUT: killed after its timeout; or --timeout passed
           first (the call keeps running: one stderr line says so)
      130  TOOL_CANCELLED and the command exited 0 (else its own code)
      125  the call did not run (rejected, no sandbox, STORAGE_FAILURE,
           TOOL_NOT_STARTED, ...)
      75   TOOL_OUTCOME_UNKNOWN: dshd crashed while it ran and its call host
           died too; it may or may not have run (check before retrying); also
           when dshd went away and did not come back within --reconnect-timeout
      1    any other errorCode with exit code 0, or an error answer
      2    a usage error, or dshd is not running (or does not answer)

    When dshd restarts meanwhile, dsh connects again (up to --reconnect-timeout;
    past it: 75) and goes on waiting, or printing from the byte it got to.
    An outage that begins less than 5 s after dshd came back shares the earlier
    outage's budget (it gets only what was left of it).
    """

    ref, call_id = session_and_call(refs)

    async def body(link: Link) -> int:
        session_id = await ride(link, lambda c: resolve_session(c, ref), note)
        call = Call(session_id, call_id)
        try:
            result = await ride(link, lambda c: wait_result(c, call, timeout), note)
        except ConnectionLost as lost:  # dshd went away (for good, or without reconnecting)
            raise CallLost(lost, session_id, call_id) from lost
        except RpcError as exc:
            if exc.code != TIMEOUT:
                raise
            note(f"dsh: call {call_id} is still running after {timeout:g} s (it keeps "
                 f"running): `dsh wait {session_id} {call_id}` again, or `dsh cancel "
                 f"{session_id} {call_id}`")
            return EXIT_TIMEOUT
        if as_json or opts.json:
            print_json(result)
            return exit_status(result)[0]
        followed = Followed(result)
        if command_ran(result):
            state = OutputState(result_known=True)  # how far it printed: on from there
            await ride(link, lambda c: _replayed(c, call, state), note)
            followed.output = state
        return result_status(followed)

    sys.exit(execute_linked(opts, body, reconnect_timeout=reconnect_timeout))


async def _replayed(client: Client, call: Call, state: OutputState) -> int:
    await replay(client, call, state)
    return 0
