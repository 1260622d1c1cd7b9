"""``dsh``: the command-line client of dshd -- the group, its options, its commands.

Theory of operation: click parses; each command lives in the module of its job
(``run``: ``dsh run``; ``attach``: ``dsh attach``; ``approve``: the answerer, ``dsh approve``,
``dsh policy``; ``show``: ``sessions``, ``log``, ``status``, ``wait``, ``cancel``; ``fsck``;
``chat``) and is one short anyio program over ``client.api.connect``
(``client.cli.common.execute``). A command's own output goes to stdout -- a tool call's output
exactly as the command wrote it, tables and logs as rich tables on a terminal and as plain
tab-separated text otherwise; progress and errors go to stderr (``client.cli.terminal``).
Every exit status comes from ``client.exits``: 2 when dshd is not running or does not answer
``initialize`` in time (``DSH_CONNECT_TIMEOUT``) and for a usage error, 1 for an error answer
of the daemon, the call's own status for ``dsh run`` / ``dsh wait``. The socket is
``--socket``, else ``$DSH_SOCKET``, else the user default (``client.paths``).
"""

from __future__ import annotations

import os

import click

from client.api import dsh_version
from client.cli.approve import approve, policy
from client.cli.attach import attach
from client.cli.chat import chat
from client.cli.common import Options
from client.cli.fsck import fsck
from client.cli.run import run
from client.cli.show import cancel, log, sessions, status, wait

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", metavar="PATH", envvar="DSH_SOCKET",
              help="dshd's socket (default: $DSH_SOCKET, else the user socket).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON where a command can.")
@click.version_option(dsh_version(), prog_name="dsh", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, socket_path: str | None, as_json: bool) -> None:
    """dsh: run commands in dshd sessions that outlive the terminal."""
    ctx.obj = Options(socket=socket_path or None, json=as_json)


for _command in (run, attach, approve, policy, sessions, log, cancel, status, wait, fsck, chat):
    cli.add_command(_command)


def hold_standard_fds() -> None:
    """A standard fd closed when dsh started (``dsh run ... <&-``) gets /dev/null, before
    anything else can take its number: a socket at fd 0 would be read as stdin."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)


def main() -> None:
    """The ``dsh`` entry point."""
    hold_standard_fds()
    cli.main(prog_name="dsh")
