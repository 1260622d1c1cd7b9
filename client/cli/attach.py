"""``dsh attach SESSION``: show a session's running calls and their live output.

Theory of operation: subscribe to the session's lane view; for each batch ``show_calls``
prints a header for each new call, its new output (``client.cli.output``: complete through
the spill file, from the window first seen on) and a footer for each that settled, asking
``tool.wait`` for its result (``client.cli.output.show_calls``). ``--call`` follows one call and exits with its status (a call
not in the first view settled before we came: its result says what became of it). Without
``--follow`` it ends once no call is in the lane. ``--approve`` hands the session to the
answerer (``client.cli.approve``).
"""

from __future__ import annotations

import sys
import anyio
import click

from client.api import Client
from client.cli.approve import answer_session
from client.cli.common import Options, execute, pass_options
from client.cli.output import (
    Printer,
    Watchers,
    finish_call,
    followed,
    keep_up,
    show_calls,
    tools_of,
)
from client.cli.terminal import note
from client.spill import CompleteOutput
from client.subscription import Subscription

__all__ = ["attach", "attach_session"]

async def attach_session(client: Client, session_id: str, call_id: str | None,
                         follow: bool) -> int:
    watchers: Watchers = {}
    printer = Printer()
    async with await client.subscribe(session_id) as sub:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(keep_up, followed(watchers, printer))
            try:
                return await _attach_views(client, session_id, call_id, follow, sub,
                                           watchers, printer)
            finally:
                tasks.cancel_scope.cancel()


async def _attach_views(client: Client, session_id: str, call_id: str | None, follow: bool,
                        sub: Subscription, watchers: Watchers, printer: Printer) -> int:
    first = True
    async for view in sub:
        if first and call_id and call_id not in tools_of(view):
            # Settled before we came (or unknown): its result says what became of it.
            result = await client.wait(session_id, call_id)
            return await finish_call(CompleteOutput(call_id, from_start=False), result)
        first = False
        settled = await show_calls(client, session_id, sub, view, watchers, printer, call_id)
        if settled is not None:
            return await finish_call(*settled)
        if not call_id and not watchers and not follow:
            if not printer.headers:
                note(f"no call is running in session {session_id}", "dim")
            return 0
    return 0


@click.command()
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
        sys.exit(execute(opts, lambda c: answer_session(c, session_id, follow), approvals=True))
    sys.exit(execute(opts, lambda c: attach_session(c, session_id, call_id, follow)))
