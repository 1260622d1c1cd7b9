"""``dsh steer [SESSION] TEXT``: add text to the running turn of a session (``turn.steer``).

Theory of operation: the text is queued by dshd to the running turn's next step boundary,
where it becomes a ``message/user`` (``steer: true``) the model reads in its next step
(PROTOCOL.md §3.5); dsh prints the turn's id and exits 0. With no turn running dshd answers
``NO_TURN``: dsh says so and how to start one, status 1. A full queue (16 steers) is dshd's
``-32013``, said as is (status 1). SESSION is any session reference (``client.cli.sessionref``;
none: the newest session of this directory). One argument is the TEXT.
"""

from __future__ import annotations

import sys

import click

from client.api import Client
from client.cli.common import Options, execute, json_flag, pass_options
from client.cli.sessionref import resolve_session
from client.cli.terminal import note, print_json
from client.exits import EXIT_ERROR, EXIT_OK
from protocol.rpc import RpcError

__all__ = ["steer"]


async def steer_session(client: Client, ref: str | None, text: str,
                        as_json: bool = False) -> int:
    session_id = await resolve_session(client, ref)
    try:
        result = await client.steer_turn(session_id, text)
    except RpcError as exc:
        if (exc.data or {}).get("code") != "NO_TURN":
            raise
        note(f"dsh: no turn is running in session {session_id}: nothing to steer; start one "
             f"with dsh chat --session {session_id} TEXT")
        return EXIT_ERROR
    if as_json:
        print_json({"sessionId": session_id, "turnId": result.turn_id, "queued": True})
    else:
        note(f"dsh: queued for turn {result.turn_id}: the model reads it at its next step")
    return EXIT_OK


@click.command("steer")
@click.argument("words", nargs=-1, required=True, metavar="[SESSION] TEXT")
@json_flag
@pass_options
def steer(opts: Options, words: tuple[str, ...], as_json: bool) -> None:
    """Add TEXT to the running turn of SESSION (default: the newest session of this
    directory): the model reads it at the turn's next step."""
    if len(words) > 2:
        raise click.UsageError("quote the text: dsh steer [SESSION] \"TEXT\"")
    ref, text = (None, words[0]) if len(words) == 1 else words
    if not text.strip():
        raise click.UsageError("the text is empty")
    sys.exit(execute(opts, lambda client: steer_session(client, ref, text,
                                                        as_json or opts.json)))
