"""``dsh web``: serve the browser page and a WebSocket relay to dshd (docs/WEB.md).

Theory of operation: parse the flags, set up logging to stderr, run
``client.web.serve.serve`` on trio and print the one URL line when it listens
(``dsh web: http://127.0.0.1:PORT/?token=TOKEN``, flushed: scripts and tests read it). A bad
``--listen``, a host beyond loopback without ``--allow-remote`` (the message says how to tunnel
over SSH), an unsafe token file or a port already taken (for ``localhost``: on 127.0.0.1 or
::1) exit 2 with a sentence on stderr; ``--max-clients`` bounds the open pages (64);
SIGTERM / SIGINT stop the bridge cleanly (exit 0). The bridge talks to dshd as the user who
started it: ``--socket``, else the group's ``--socket`` / ``$DSH_SOCKET``, else the user socket.
"""

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path

import click

from client.cli.common import Options, pass_options
from client.exits import EXIT_DAEMON_NOT_RUNNING as EXIT_USAGE  # 2: usage or setup error

__all__ = ["web"]


@click.command("web")
@click.option("--listen", default="127.0.0.1:8470", show_default=True, metavar="HOST:PORT",
              help="Address to listen on; port 0 picks a free one.")
@click.option("--allow-remote", is_flag=True,
              help="Allow a listen address beyond loopback (prefer an SSH tunnel).")
@click.option("--new-token", is_flag=True, help="Replace the token: old cookies stop working.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), metavar="PATH",
              help="Token file (default: $XDG_RUNTIME_DIR/dsh/web-token, else "
              "/tmp/dsh-$UID/web-token).")
@click.option("--max-clients", type=click.IntRange(1, 200), default=64, show_default=True,
              metavar="N", help="Most pages (WebSockets) open at once; each holds one of "
              "dshd's 256 connections.")
@click.option("--socket", "socket_opt", metavar="PATH", help="dshd's socket (as the group's).")
@pass_options
def web(opts: Options, listen: str, allow_remote: bool, new_token: bool,
        token_file: Path | None, max_clients: int, socket_opt: str | None) -> None:
    """Serve the web page: sessions, output, approvals and chat in a browser."""
    import trio

    from client.web.serve import AddressInUse, serve

    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sock = socket_opt or opts.socket
    run = partial(serve, listen, socket=Path(sock) if sock else None, token_file=token_file,
                  new_token=new_token, allow_remote=allow_remote, max_clients=max_clients)
    try:
        refused = trio.run(_main, run)
    except KeyboardInterrupt:
        return
    if refused is not None:
        text = refused.strerror if isinstance(refused, AddressInUse) else str(refused)
        click.echo(text if text.startswith("dsh web:") else f"dsh web: {text}", err=True)
        sys.exit(EXIT_USAGE)


async def _main(run) -> Exception | None:
    """Serve; print the URL once listening. A setup error is returned (the caller exits 2)."""
    import trio

    from client.web.auth import TokenFileError
    from client.web.serve import ListenError, RemoteRefused

    async with trio.open_nursery() as nursery:
        try:
            url = await nursery.start(run)
        except (ListenError, RemoteRefused, TokenFileError, OSError) as exc:
            return exc
        click.echo(f"dsh web: {url}")
        sys.stdout.flush()
    return None
