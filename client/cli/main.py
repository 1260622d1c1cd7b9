"""``dsh``: the command-line client of dshd -- the group, its options, its commands.

Theory of operation: click parses; each command lives in the module of its job
(``run``: ``dsh run``; ``attach``: ``dsh attach``; ``approve``: the answerer;
``approvals``: ``dsh approvals``, ``dsh approve``, ``dsh policy``; ``show``: ``sessions``,
``rename``, ``status``, ``wait``, ``cancel``; ``logshow``: ``log``; ``fsck``;
``chat``) and is one short anyio program over ``client.api.connect``
(``client.cli.common.execute``). A command's own output goes to stdout -- a tool call's output
exactly as the command wrote it, tables and logs as rich tables on a terminal and as plain
tab-separated text otherwise; progress and errors go to stderr (``client.cli.terminal``).
Every exit status comes from ``client.exits``: 2 when dshd is not running or does not answer
``initialize`` in time (``DSH_CONNECT_TIMEOUT``) and for a usage error, 1 for an error answer
of the daemon, the call's own status for ``dsh run`` / ``dsh wait``. The socket is
``--socket``, else ``$DSH_SOCKET``, else the user default (``client.paths``).

The group loads a command's module only when that command runs (:class:`LazyGroup`, by the
table :data:`COMMANDS`): ``dsh run`` does not import the answerer, the chat or rich's tables,
and ``dsh --version`` imports nothing but click (no event loop, no msgspec, no client
library). ``dsh --help`` loads every command to list its short help.
"""

from __future__ import annotations

import importlib
import os

import click

import client

__all__ = ["COMMANDS", "LazyGroup", "cli", "main"]

#: Command name -> (its module, the click command's name in it), in ``--help`` order.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("client.cli.run", "run"),
    "attach": ("client.cli.attach", "attach"),
    "approve": ("client.cli.approvals", "approve"),
    "approvals": ("client.cli.approvals", "approvals"),
    "policy": ("client.cli.approvals", "policy"),
    "sessions": ("client.cli.show", "sessions"),
    "log": ("client.cli.logshow", "log"),
    "rename": ("client.cli.show", "rename"),
    "cancel": ("client.cli.show", "cancel"),
    "status": ("client.cli.show", "status"),
    "wait": ("client.cli.show", "wait"),
    "fsck": ("client.cli.fsck", "fsck"),
    "chat": ("client.cli.chat", "chat"),
    "rm": ("client.cli.cleanup", "rm"),
    "prune": ("client.cli.cleanup", "prune"),
    "steer": ("client.cli.steer", "steer"),
    "help": ("client.cli.help", "help_command"),
    "completion": ("client.cli.completion", "completion"),
    "web": ("client.cli.web", "web"),
    "tui": ("client.cli.tui", "tui"),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when asked for (``COMMANDS``), not at start."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands), key=list(COMMANDS).index)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", metavar="PATH", envvar="DSH_SOCKET",
              help="dshd's socket (default: $DSH_SOCKET, else the user socket).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON where a command can.")
@click.version_option(client.__version__, prog_name="dsh", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, socket_path: str | None, as_json: bool) -> None:
    """dsh: run commands in dshd sessions that outlive the terminal."""
    from client.cli.common import Options  # here, not at start: --version needs none of it

    ctx.obj = Options(socket=socket_path or None, json=as_json)


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
