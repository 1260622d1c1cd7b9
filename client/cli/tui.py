"""``dsh tui``: the terminal UI (``client.tui.app.DshApp``).

Theory of operation: the command builds the app with the socket (``--socket``, the group's
option or ``$DSH_SOCKET``) and the session to watch first, and runs it on Textual's asyncio
loop; the app connects by itself and keeps connecting while dshd is away, so ``dsh tui``
starts even when dshd does not run yet (it shows a banner until it does).
"""

from __future__ import annotations

import click

from client.cli.common import Options, pass_options

__all__ = ["tui"]


@click.command("tui")
@click.option("--socket", "socket_path", metavar="PATH",
              help="dshd's socket (default: the group's --socket, $DSH_SOCKET, the user socket).")
@click.argument("session", required=False)
@pass_options
def tui(opts: Options, socket_path: str | None, session: str | None) -> None:
    """A live screen of every session, call, approval and turn (keys: press ?)."""
    from client.tui.app import DshApp  # here: textual loads only for this command

    DshApp(socket=socket_path or opts.socket, session=session).run()
