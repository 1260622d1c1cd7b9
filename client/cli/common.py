"""What every ``dsh`` command shares: the global options and how a command body is run.

Theory of operation: ``execute`` runs one command body -- an async function of a connected
``client.api.Client`` -- as one anyio program on ``BACKEND`` and turns whatever ended it into
an exit status (``client.exits.failure_status``: one stderr line, a status; an unknown
exception is re-raised with its traceback).

The CLI runs on trio (``BACKEND``): the library is anyio and runs on asyncio as well (the
tests run it on both), but the CLI's Ctrl-C handling, signal receivers and subprocess tests
were built and proven on trio, and trio is installed with dsh anyway (the daemon runs on it);
asyncio would buy the CLI nothing.

``execute_linked`` runs a body that rides through a daemon restart (``dsh run``, ``dsh
attach``, ``dsh wait``): it gets a ``client.link.Link`` instead of a client, which opens a new
connection when the old one was lost, within ``--reconnect-timeout`` (``reconnect_option``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import anyio
import click

from client.api import Client, connect
from client.cli.terminal import note, silence_stdout
from client.exits import failure_status
from client.link import DEFAULT_RECONNECT_TIMEOUT, STABLE_S, Link, open_link

__all__ = ["Options", "pass_options", "json_flag", "execute", "execute_linked", "run_program",
           "reconnect_option", "RECONNECT_RULE", "BACKEND"]

#: The event loop the ``dsh`` CLI runs on (module doc).
BACKEND = "trio"


@dataclass
class Options:
    """The group's options, handed to every command."""

    socket: str | None
    json: bool = False


pass_options = click.make_pass_decorator(Options)


def json_flag(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(func)


def run_program(main: Callable[[], Awaitable[int]]) -> int:
    """Run ``main`` on ``BACKEND``; map what ended it to an exit status."""
    try:
        return anyio.run(main, backend=BACKEND)
    except BaseException as raised:  # noqa: BLE001 - mapped below, re-raised when unknown
        code = failure_status(raised, note, silence_stdout)
        if code is None:
            raise
        return code


def execute(opts: Options, body: Callable[[Client], Awaitable[int]], *,
            approvals: bool = False) -> int:
    """Connect, run ``body``, map client errors to one stderr line and an exit status.
    ``approvals``: connect as an approval answerer (PROTOCOL.md §3.4)."""

    async def main() -> int:
        async with connect(opts.socket, approvals=approvals) as client:
            return await body(client)

    return run_program(main)


#: How ``dsh run``, ``dsh attach`` and ``dsh wait`` ride through a daemon restart (their help).
RECONNECT_RULE = f"""\b
When dshd restarts (systemctl restart, an upgrade, a crash):
  the command keeps running in its call host, and dsh says one line
  ("dsh: lost dshd; reconnecting (up to {DEFAULT_RECONNECT_TIMEOUT:g} s)..."), connects again
  (0.1 s back-off doubling to 2 s), says one line when dshd is back
  and goes on from the byte it had printed through: no byte twice,
  none missing. An answerer (--approve) subscribes again and answers
  a request asked again after the restart. Past --reconnect-timeout
  dsh gives up with status 75; --reconnect-timeout 0 turns this off
  (a lost connection ends dsh at once, as it did before). An outage
  that begins less than {STABLE_S:g} s after dshd came back shares the earlier
  outage's budget (it gets only what was left of it), so a daemon
  that keeps dropping dsh cannot keep it waiting forever."""


def reconnect_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--reconnect-timeout SECONDS`` (``RECONNECT_RULE``)."""
    return click.option(
        "--reconnect-timeout", "reconnect_timeout", default=DEFAULT_RECONNECT_TIMEOUT,
        show_default=True, type=click.FloatRange(min=0, max=86400), metavar="S",
        help="When dshd goes away, wait up to S seconds for it to come back (0: do not; "
             "past S: exit 75).")(func)


def execute_linked(opts: Options, body: Callable[[Link], Awaitable[int]], *,
                   reconnect_timeout: float, approvals: bool = False) -> int:
    """``execute`` for a body that takes a ``Link`` (module doc)."""

    async def main() -> int:
        async with open_link(opts.socket, approvals=approvals,
                             timeout=reconnect_timeout) as link:
            return await body(link)

    return run_program(main)
