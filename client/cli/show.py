"""The commands that show what dshd holds, and the one-call commands: ``dsh sessions``,
``dsh log``, ``dsh status``, ``dsh wait``, ``dsh cancel``.

Theory of operation: each is one request (or one page walk) and prints its answer: as JSON
with ``--json`` (the result struct encoded as on the wire; ``dsh log`` prints each record as
dshd sent it), else as text -- a rich table on a terminal, tab-separated text otherwise,
every cell on one line and cut to a width (``client.cli.terminal.cell``). ``dsh wait`` prints
the call's complete output once it settled -- every retained byte, from the raw channel
(``client.cli.stream.replay``), not the result's window -- and exits with the call's status
(``client.exits``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
import msgspec
from msgspec import UNSET
from rich.table import Table

from client.api import CallLost, Client
from client.cli.common import (
    Options, execute, execute_linked, json_flag, pass_options, reconnect_option,
)
from client.cli.stream import Call, Followed, OutputState, replay, result_status, wait_result
from client.link import Link, ride
from client.transport import ConnectionLost
from client.cli.terminal import cell, emit, fmt_time, is_tty, note, print_json, short, stdout
from client.exits import decided_status, exit_status
from protocol.printable import printable
from client.spill import command_ran
from protocol.methods import CancelledResult, SessionInfo

__all__ = ["sessions", "log", "status", "wait", "cancel", "TITLE_WIDTH", "REASON_WIDTH"]

#: Widths of the title and of a damaged session's reason in ``dsh sessions``' table.
TITLE_WIDTH = 60
REASON_WIDTH = 40
HEADERS = ["id", "title", "cwd", "created", "running", "lastSeq"]


def _given(value: Any, default: Any = "") -> Any:
    """A field's value, ``default`` when the session has none (``UNSET``: a damaged one)."""
    return default if value is UNSET else value


def _session_row(s: SessionInfo) -> list[str]:
    title = cell(_given(s.title) or "", TITLE_WIDTH)
    if s.damaged:
        title = f"DAMAGED ({cell(s.damaged, REASON_WIDTH)}) {title}".rstrip()
    return [cell(s.session_id), title, cell(_given(s.cwd)), fmt_time(_given(s.created_at, None)),
            cell(_given(s.running)), cell(_given(s.last_seq))]


@click.command()
@json_flag
@pass_options
def sessions(opts: Options, as_json: bool) -> None:
    """List the sessions."""

    async def body(client: Client) -> int:
        rows = await client.list_sessions()
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
            emit("".join("\t".join(r) + "\n" for r in [HEADERS, *cells]))
        return 0

    sys.exit(execute(opts, body))


@click.command()
@click.argument("session_id", metavar="SESSION")
@click.option("--after", "after_seq", type=click.IntRange(min=-1), default=-1, metavar="N",
              help="Only events with seq > N (default: all).")
@json_flag
@pass_options
def log(opts: Options, session_id: str, after_seq: int, as_json: bool) -> None:
    """Print the durable events of SESSION, one a line."""

    async def body(client: Client) -> int:
        async for raw in client.iter_records(session_id, after_seq):
            event = msgspec.json.decode(raw)  # the record as it is: every type, every key
            if as_json or opts.json:
                print_json(event)
                continue
            line = (f"{event.get('seq', '?'):>6}  {fmt_time(event.get('time'), millis=True)}  "
                    f"{str(event.get('type', '?')):<17} {short(event.get('data'))}")
            emit(printable(line) + "\n")
        return 0

    sys.exit(execute(opts, body))


@click.command()
@click.argument("session_id", metavar="SESSION")
@click.argument("call_id", metavar="CALL")
@json_flag
@pass_options
def cancel(opts: Options, session_id: str, call_id: str, as_json: bool) -> None:
    """Cancel a running call (exit 1 when it was not running)."""

    async def body(client: Client) -> int:
        cancelled = await client.cancel(session_id, call_id)
        if as_json or opts.json:
            print_json(CancelledResult(cancelled=cancelled))
        else:
            note(f"call {call_id} cancelled" if cancelled else f"call {call_id} was not running")
        return decided_status(already=not cancelled)

    sys.exit(execute(opts, body))


@click.command()
@json_flag
@pass_options
def status(opts: Options, as_json: bool) -> None:
    """Show the daemon's status."""

    async def body(client: Client) -> int:
        info = await client.status()
        if as_json or opts.json:
            print_json(info)
            return 0
        lines = []
        for key, value in msgspec.to_builtins(info).items():
            if key == "startedAt":
                value = fmt_time(value)
            elif isinstance(value, (dict, list)):
                value = json.dumps(value, separators=(", ", ": "))
            lines.append(printable(f"{key}: {value}") + "\n")
        emit(f"socket: {client.socket_path}\n" + "".join(lines))
        return 0

    sys.exit(execute(opts, body))


@click.command()
@click.argument("session_id", metavar="SESSION")
@click.argument("call_id", metavar="CALL")
@click.option("--timeout", type=click.FloatRange(min=0), metavar="S",
              help="Give up waiting after S seconds (the call keeps running).")
@reconnect_option
@json_flag
@pass_options
def wait(opts: Options, session_id: str, call_id: str, timeout: float | None,
         reconnect_timeout: float, as_json: bool) -> None:
    """Wait for a call's result; print its complete output and exit with its exit code.

    \b
    Exit status (never 0 when the call is an error):
      N    the command's exit code
      124  TOOL_TIMEOUT: killed after its timeout
      130  TOOL_CANCELLED and the command exited 0 (else its own code)
      125  the call did not run (rejected, no sandbox, STORAGE_FAILURE,
           TOOL_NOT_STARTED, ...)
      75   TOOL_OUTCOME_UNKNOWN: dshd crashed while it ran and its call host
           died too; it may or may not have run (check before retrying); also
           when dshd went away and did not come back within --reconnect-timeout
      1    any other errorCode with exit code 0, or an error answer (e.g. --timeout
           passed: the call keeps running)
      2    a usage error, or dshd is not running (or does not answer)

    When dshd restarts meanwhile, dsh connects again (up to --reconnect-timeout;
    past it: 75) and goes on waiting, or printing from the byte it got to.
    An outage that begins less than 5 s after dshd came back shares the earlier
    outage's budget (it gets only what was left of it).
    """

    async def body(link: Link) -> int:
        call = Call(session_id, call_id)
        try:
            result = await ride(link, lambda c: wait_result(c, call, timeout), note)
        except ConnectionLost as lost:  # dshd went away (for good, or without reconnecting)
            raise CallLost(lost, session_id, call_id) from lost
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
