"""``dsh attach [SESSION]``: show a session's running calls and their live output.

SESSION is an id, a name or a unique prefix (``client.cli.sessionref``); without it the newest
session of the current directory with a running call or turn (none: the newest), said on
stderr.

Theory of operation: one call -- ``--call``, or the only call running -- is attached over the
raw channel (``attach_call``): its complete retained output is replayed from byte 0 (or from
the start of its last ``--tail N`` lines, found backwards with ``tool.read``:
``client.raw.tail_offset``), then followed live (``client.cli.stream.follow_call``) to its end,
and dsh exits with its status. A call that runs under a PTY (its arguments say ``tty``) gets
this terminal's keys and size too, by the rule of ``dsh run -t`` (``KEYS_RULE``), starting
with one ``tool.resize`` to this terminal's size so that a full-screen program redraws. Bytes
the per-call disk cap dropped are said in one line on stderr.

A session whose agent turn runs (the lane's ``turn``; no ``--call``, no ``--follow``) is shown
as ``dsh chat --attach`` shows it (``client.cli.chat.watch_turn``): the turn so far from the
log, the current step's streaming text and its calls' output, live to the turn's end, and dsh
exits with the turn's status; approvals are not answered here (``--approve`` does).

Several calls (or ``--follow`` without ``--call``, which waits for new ones) use the lane
view: for each batch ``show_calls`` prints a header for each new call, its new output
(``client.cli.output``: complete through the spill file, from the window first seen on) and
a footer for each that settled, asking ``tool.wait`` for its result. Without ``--follow`` it
ends once no call is in the lane. ``--approve`` hands the session to the
answerer (``client.cli.approve``).

Across a daemon restart (``client.link``): one call is followed on from the byte printed
through (``follow_call``); the lane view is subscribed again on the new connection with the
same ``Watchers`` and ``Printer`` (so a call's output goes on from what was shown, as after a
resubscribe); the answerer starts again on the new connection (``client.link.ride``) and
shows each request still pending -- one asked again after the restart keeps its id. Only a
daemon that does not come back within ``--reconnect-timeout`` (or a lost connection with
``--reconnect-timeout 0``) ends it, with status 75 and how to learn the call's fate.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import click

from client.api import CallLost, Client
from client.cli.approve import answer_across_restarts
from client.cli.common import (
    RECONNECT_RULE, Options, execute_linked, pass_options, reconnect_option,
)
from client.cli.keys import DEFAULT_DETACH_KEYS, detach_keys_option
from client.cli.localterm import isatty, terminal_size
from client.cli.output import (
    Printer,
    Watchers,
    call_header,
    ended_line,
    finish_call,
    followed,
    keep_up,
    show_calls,
    tools_of,
)
from client.cli.sessionref import SESSION_REF, resolve_session
from client.cli.stream import (
    KEYS_RULE, Call, Io, call_is_tty, follow_call, left_early, result_status,
)
from client.cli.terminal import note
from client.exits import single
from client.link import Link, ride
from client.raw import tail_offset
from client.subscription import Subscription
from client.transport import ConnectionLost
from protocol.rpc import RpcError

__all__ = ["attach", "attach_session", "attach_call"]


async def attach_session(link: Link, session_id: str, call_id: str | None,
                         follow: bool, tail: int | None = None,
                         detach_keys: bytes = b"") -> int:
    watchers: Watchers = {}
    printer = Printer()
    try:
        return await ride(link, lambda client: _attach_once(
            link, client, session_id, call_id, follow, tail, detach_keys, watchers, printer),
            note)
    except BaseException as raised:  # noqa: BLE001 - re-raised; 75 when dshd did not come back
        lost = single(raised)
        if isinstance(lost, ConnectionLost) and not isinstance(lost, CallLost):
            raise CallLost(lost, session_id, call_id or "CALL") from raised
        raise


async def _attach_once(link: Link, client: Client, session_id: str, call_id: str | None,
                       follow: bool, tail: int | None, detach_keys: bytes, watchers: Watchers,
                       printer: Printer) -> int:
    """One connection's attach (``ride`` runs it again after a lost connection)."""
    async with await client.subscribe(session_id) as sub:
        if not follow or call_id is not None:
            view = await sub.next_view()
            if call_id is None and isinstance(view.get("turn"), dict):
                from client.cli.chat import watch_turn  # the chat's screen, only for a turn

                return await watch_turn(client, sub, session_id)
            tools = tools_of(view)
            one = call_id or (next(iter(tools)) if len(tools) == 1 else None)
            if one is not None:
                await sub.aclose()
                return await attach_call(link, Call(session_id, one), tools.get(one),
                                         tail, detach_keys)
            if not tools:
                note(f"no call is running in session {session_id}", "dim")
                return 0
        if tail is not None:
            raise click.UsageError("--tail shows one call: several run, pick one with --call")
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(keep_up, followed(watchers, printer))
            try:
                return await _attach_views(client, session_id, call_id, follow, sub,
                                           watchers, printer)
            finally:
                tasks.cancel_scope.cancel()


async def attach_call(link: Link, call: Call, entry: Any, tail: int | None,
                      detach_keys: bytes) -> int:
    """Replay one call's output (all of it, or its last ``tail`` lines), follow it to its end,
    with this terminal's keys and size for a tty call; its exit status (module doc)."""
    client = link.client
    offset = 0
    if tail is not None:
        offset, first = await tail_offset(client, call.session_id, call.call_id, tail)
        if first > 0 and offset == first:
            note(f"dsh: the per-call disk cap (spill_max_bytes) dropped the first {first} bytes "
                 "of the output; shown from the oldest byte kept")
    raw = call_is_tty(entry) and isatty(0)  # off a terminal, attach only watches
    io = Io(tty=raw, raw=raw, detach_keys=detach_keys if raw else b"")
    note(call_header(call.call_id, entry), "bold")
    if io.raw:
        cols, rows = terminal_size()
        try:
            await client.resize(call.session_id, call.call_id, cols, rows)
        except RpcError:
            pass  # settled meanwhile: nothing to resize
    followed = await follow_call(link, call, offset, io)
    early = left_early(call, followed, io)
    if early is not None:
        return early
    status = result_status(followed)
    note(ended_line(call.call_id, followed.result), "dim")
    return status


async def _attach_views(client: Client, session_id: str, call_id: str | None, follow: bool,
                        sub: Subscription, watchers: Watchers, printer: Printer) -> int:
    async for view in sub:
        settled = await show_calls(client, session_id, sub, view, watchers, printer, call_id)
        if settled is not None:
            return await finish_call(*settled)
        if not call_id and not watchers and not follow:
            if not printer.headers:
                note(f"no call is running in session {session_id}", "dim")
            return 0
    return 0


ATTACH_HELP = """Show the running calls of SESSION and their live output.

SESSION: an id, a name or a unique prefix; without it, the newest session of the
current directory with a running call or turn, else the newest (said on stderr).

While an agent turn runs in SESSION (dsh chat), show the turn instead: the turn so far
(its input, the assistant's text, the calls and their results), then its text and calls
live to its end; the status is the turn's (as dsh chat --attach).

One call (--call, or the only one running) is shown complete: its retained output from
the first byte (--tail N: its last N lines), then live to its end; dsh exits with its
status. A call run with -t gets this terminal's keys and size (below). Several calls, or
--follow, show each call from its window on, with a header per call.

With --approve, also show each pending approval request (the exact command, the call and
the sandbox it would run in) and answer it with y or n on stdin. Without --follow it ends
once no call runs and no request is pending; a closed stdin with a request unanswered
detaches with status 1.

""" + KEYS_RULE + """

""" + RECONNECT_RULE


@click.command(help=ATTACH_HELP)
@click.argument("ref", metavar="[SESSION]", required=False, type=SESSION_REF)
@click.option("--call", "call_id", metavar="ID", help="Follow only this call (exit with its status).")
@click.option("--tail", type=click.IntRange(min=0), metavar="N",
              help="Start at the last N lines of the call's output (default: all of it).")
@click.option("--detach-keys", "detach_keys", default=DEFAULT_DETACH_KEYS, show_default=True,
              callback=detach_keys_option, metavar="KEYS",
              help='For a -t call: the sequence that detaches (docker\'s format; "" for none).')
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new calls.")
@click.option("--approve", is_flag=True,
              help="Answer the session's approval requests: y/n for each, read from stdin.")
@click.option("--json", "as_json", is_flag=True,
              help='No output: one JSON line {"sessionId","callId","result"} per call as it '
                   "settles (result: its ToolResult, as dsh wait --json prints it).")
@reconnect_option
@pass_options
def attach(opts: Options, ref: str | None, call_id: str | None, tail: int | None,
           detach_keys: bytes, follow: bool, approve: bool, as_json: bool,
           reconnect_timeout: float) -> None:
    if approve and (call_id or tail is not None):
        raise click.UsageError("--approve answers for the whole session: not with --call "
                               "or --tail")
    as_json = as_json or opts.json
    if as_json and (approve or tail is not None):
        raise click.UsageError("--json prints results: not with --approve or --tail")

    async def body(link: Link) -> int:
        session_id = await ride(link, lambda c: resolve_session(c, ref, running=True), note)
        if as_json:
            from client.cli.attachjson import attach_json
            return await attach_json(link, session_id, call_id, follow)
        if approve:
            return await answer_across_restarts(link, session_id, follow)
        return await attach_session(link, session_id, call_id, follow, tail, detach_keys)

    sys.exit(execute_linked(opts, body, reconnect_timeout=reconnect_timeout,
                            approvals=approve))
