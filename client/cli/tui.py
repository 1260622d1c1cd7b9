"""``dsh tui``: the terminal UI (``client.tui.app.DshApp``).

Theory of operation: the command builds the app with the socket (``--socket``, the group's
option or ``$DSH_SOCKET``) and the session to watch first, and runs it on Textual's asyncio
loop; the app connects by itself and keeps connecting while dshd is away, so ``dsh tui``
starts even when dshd does not run yet (it shows a banner until it does).

SESSION is resolved before the screen starts, as ``dsh attach`` resolves it
(``client.cli.sessionref.resolve_session``: an id, a name or a unique prefix of either): one
short connection (bounded by ``RESOLVE_TIMEOUT_S``). A reference that names no session, or
more than one (the daemon's sentence lists the candidates), is a usage error: one line on
stderr and exit 2, before the screen takes the terminal. Without SESSION it is the newest
session of the current directory, when there is one (else the app watches the newest). With
dshd not reachable the reference goes to the app unresolved: the app resolves it once it is
connected (``client.tui.watching``) and says on screen what it could not find.
"""

from __future__ import annotations

import anyio
import click

from client.cli.common import BACKEND, Options, pass_options
from client.cli.sessionref import SESSION_REF

__all__ = ["tui", "pick_session", "RESOLVE_TIMEOUT_S"]

#: The whole of the resolving connection before the screen starts (seconds): past it, dshd is
#: taken as away and the app resolves once it connects.
RESOLVE_TIMEOUT_S = 5.0


def pick_session(socket: str | None, ref: str | None) -> tuple[str | None, bool]:
    """``(what the app watches first, resolved?)``: the session id ``ref`` names (None: the
    newest of the current directory, or None when it has none), or ``ref`` as given when dshd
    is not reachable (``resolved`` False). Raises ``click.UsageError`` when ``ref`` names no
    session or several."""
    from client.api import connect
    from client.cli.sessionref import resolve_session
    from client.transport import DshClientError
    from protocol.rpc import SESSION_NOT_FOUND, RpcError

    async def main() -> tuple[str | None, bool]:
        with anyio.move_on_after(RESOLVE_TIMEOUT_S):
            try:
                async with connect(socket, "dsh-tui") as client:
                    try:
                        return await resolve_session(client, ref, say=lambda _: None), True
                    except RpcError as exc:
                        if exc.code != SESSION_NOT_FOUND:
                            raise
                        if ref is not None:
                            raise click.UsageError(exc.message) from None
                        return None, True  # no session in this directory: the newest
                    except click.UsageError:
                        if ref is not None:
                            raise
                        return None, True  # the current directory is gone: the newest
            except (DshClientError, OSError):
                pass
        return ref, False

    return anyio.run(main, backend=BACKEND)


@click.command("tui")
@click.option("--socket", "socket_path", metavar="PATH",
              help="dshd's socket (default: the group's --socket, $DSH_SOCKET, the user socket).")
@click.argument("session", required=False, type=SESSION_REF)
@pass_options
def tui(opts: Options, socket_path: str | None, session: str | None) -> None:
    """A live screen of every session, call, approval and turn (keys: press ?).

    SESSION: an id, a name or a unique prefix (one that names none or several is an error,
    exit 2); without it, the newest session of the current directory, else the newest."""
    from client.tui.app import DshApp  # here: textual loads only for this command

    socket = socket_path or opts.socket
    watch, resolved = pick_session(socket, session)
    DshApp(socket=socket, session=watch, resolve=not resolved).run()
