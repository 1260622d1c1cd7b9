"""``dsh log``: the durable events of a session, one a line, and ``dsh log -f`` to follow them.

Theory of operation: the events are paged with ``session.events`` (``Client.iter_records``)
and printed as they come: one line each (seq, time, type, data cut to a width), or with
``--json`` each record as dshd sent it. ``-f`` keeps asking for the events after the last one
printed, every :data:`FOLLOW_POLL_S` seconds, until Ctrl-C (exit 130) -- it rides through a
daemon restart like ``dsh attach`` (``client.link.ride``), so a follow that outlives dshd goes
on from the seq it printed through: no event twice, none missing. A damaged log prints its
intact events -- those before the damaged frame, which dshd still verified -- then says on
stderr where the damage is (the daemon's ``LOG_DAMAGED`` with its byte offset) and exits 1.
"""

from __future__ import annotations

import sys

import anyio
import click
import msgspec

from client.api import Client
from client.cli.common import Options, execute_linked, json_flag, pass_options, reconnect_option
from client.cli.sessionref import SESSION_REF, resolve_session
from client.cli.terminal import emit, fmt_time, note, print_json, short
from client.exits import EXIT_ERROR
from client.link import Link, ride
from protocol.printable import printable
from protocol.rpc import RpcError

__all__ = ["FOLLOW_POLL_S", "log"]

#: Seconds between two asks for new events while following (``-f``).
FOLLOW_POLL_S = 0.5


def _damaged(exc: RpcError) -> bool:
    return isinstance(exc.data, dict) and exc.data.get("code") == "LOG_DAMAGED"


class _Printer:
    """Prints records and remembers the last seq printed (where a follow goes on from)."""

    def __init__(self, after_seq: int, as_json: bool) -> None:
        self.last, self.as_json = after_seq, as_json

    async def page(self, client: Client, session_id: str) -> None:
        async for raw in client.iter_records(session_id, self.last):
            event = msgspec.json.decode(raw)  # the record as it is: every type, every key
            if isinstance(event.get("seq"), int):
                self.last = max(self.last, event["seq"])
            if self.as_json:
                print_json(event)
                continue
            line = (f"{event.get('seq', '?'):>6}  {fmt_time(event.get('time'), millis=True)}  "
                    f"{str(event.get('type', '?')):<17} {short(event.get('data'))}")
            emit(printable(line) + "\n")


@click.command()
@click.argument("ref", metavar="[SESSION]", required=False, type=SESSION_REF)
@click.option("--after", "after_seq", type=click.IntRange(min=-1), default=-1, metavar="N",
              help="Only events with seq > N (default: all).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new events as they are logged, until Ctrl-C.")
@reconnect_option
@json_flag
@pass_options
def log(opts: Options, ref: str | None, after_seq: int, follow: bool, reconnect_timeout: float,
        as_json: bool) -> None:
    """Print the durable events of SESSION, one a line.

    SESSION: an id, a name or a unique prefix; without it, the newest session of
    the current directory (said on stderr). A damaged log prints the intact
    events before the damage, then says where it is (exit 1).
    """
    printer = _Printer(after_seq, as_json or opts.json)

    async def body(link: Link) -> int:
        session_id = await ride(link, lambda c: resolve_session(c, ref), note)
        try:
            await ride(link, lambda c: printer.page(c, session_id), note)
            while follow:
                await anyio.sleep(FOLLOW_POLL_S)
                await ride(link, lambda c: printer.page(c, session_id), note)
        except RpcError as exc:
            if not _damaged(exc):
                raise
            note(f"dsh: {exc.message}")
            return EXIT_ERROR
        return 0

    sys.exit(execute_linked(opts, body, reconnect_timeout=reconnect_timeout))
