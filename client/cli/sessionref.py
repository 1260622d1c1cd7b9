"""How a ``dsh`` command names a session: an id, a name, a unique prefix of either, or nothing
(the newest session of the current directory).

Theory of operation: the daemon resolves (``session.find``, PROTOCOL.md §3.1) so that every
frontend resolves alike; :func:`resolve_session` asks it and says on stderr which session a
prefix or the default chose (``dsh: using session ID (NAME), the newest in DIR``; ``dsh:
PREFIX matched ID``; ``dsh attach`` asks for the newest session with a running call or turn
first: ``..., the newest in DIR with a running call or turn``). An ambiguous prefix or a directory without sessions is the daemon's
``-32004`` (its sentence and, when ambiguous, its candidates: the command exits 1 as for
any error answer). :data:`SESSION_REF` is the click parameter type of every session argument
and option; its ``shell_complete`` lists the names and ids the daemon holds that start with
what was typed. Completion runs inside the user's shell, so it never fails and never hangs
it: one connection with a short bound (:data:`COMPLETE_TIMEOUT_S`, all of it: connect,
``initialize``, ``session.list``); on any error or past the bound it completes nothing.
An older dshd that lists no ``session.find`` gets the reference as given (an exact id).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import click
from click.shell_completion import CompletionItem

from client.cli.terminal import note

__all__ = ["COMPLETE_TIMEOUT_S", "SESSION_REF", "SessionRef", "complete_sessions",
           "resolve_session"]

#: The whole of one completion's talk with dshd, seconds (module doc).
COMPLETE_TIMEOUT_S = 1.0
#: Completions offered, at most (a shell lists them all).
COMPLETE_MAX = 200


class SessionRef(click.ParamType):
    """A session reference (module doc): the string as typed; resolved by
    :func:`resolve_session` once connected."""

    name = "session"

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[CompletionItem]:
        root = ctx.find_root()
        socket = root.params.get("socket_path") if root.params else None
        return [CompletionItem(value, help=help_) for value, help_ in
                complete_sessions(socket, incomplete)]


SESSION_REF = SessionRef()


def complete_sessions(socket: str | None, incomplete: str,
                      timeout: float = COMPLETE_TIMEOUT_S) -> list[tuple[str, str]]:
    """``(value, help)`` of the names and ids that start with ``incomplete``, names first;
    ``[]`` on any error or past ``timeout`` (module doc)."""
    try:
        import anyio

        from client.api import connect

        async def main() -> list:
            with anyio.move_on_after(timeout):
                async with connect(socket) as client:
                    return await client.list_sessions()
            return []

        infos = anyio.run(main, backend="trio")
    except Exception:  # noqa: BLE001 - completion must never fail the shell
        return []
    names: list[tuple[str, str]] = []
    ids: list[tuple[str, str]] = []
    for info in sorted(infos, key=lambda i: (i.updated_at or 0) if isinstance(
            i.updated_at, int) else 0, reverse=True):
        name = info.name if isinstance(info.name, str) else None
        cwd = info.cwd if isinstance(info.cwd, str) else ""
        if name and name.startswith(incomplete):
            names.append((name, f"{info.session_id} {cwd}".strip()))
        if info.session_id.startswith(incomplete):
            ids.append((info.session_id, f"{name or ''} {cwd}".strip()))
    return (names + ids)[:COMPLETE_MAX]


async def resolve_session(client: Any, ref: str | None, *, cwd: str | None = None,
                          say: Callable[[str], None] = note, running: bool = False) -> str:
    """The id of the session ``ref`` names, or with ``ref`` None the newest session of
    ``cwd`` (default: the current directory; ``running``: the newest there with a running
    call or turn first, ``dsh attach``); says on stderr what a prefix or the default chose
    (module doc). Raises ``RpcError`` (-32004) when nothing or more than one matches."""
    server = getattr(client, "server", None)
    if server is not None and "session.find" not in server.methods:
        # An older dshd (it lists no session.find): a reference is an exact id there.
        if ref is None:
            raise click.UsageError("this dshd cannot pick a session for you (it is older than "
                                   "dsh); name the session's id")
        return ref
    if ref is None and cwd is None:
        try:
            cwd = os.path.realpath(os.getcwd())
        except OSError:
            raise click.UsageError("the current directory no longer exists; name a session "
                                   "(`dsh sessions` lists them)") from None
    session_id, how, name = await client.find_session_named(
        ref, cwd if ref is None else None, running and ref is None)
    named = f" ({name})" if name else ""
    if how == "newest-in-cwd":
        say(f"dsh: using session {session_id}{named}, the newest in {cwd}")
    elif how == "running-in-cwd":
        say(f"dsh: using session {session_id}{named}, the newest in {cwd} with a running "
            "call or turn")
    elif how == "prefix":
        say(f"dsh: {ref} matched {session_id}{named}")
    return session_id
