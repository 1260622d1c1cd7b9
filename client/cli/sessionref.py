"""How a ``dsh`` command names a session: an id, a name, a unique prefix of either, or nothing
(the newest session of the current directory).

Theory of operation: the daemon resolves (``session.find``, PROTOCOL.md §3.1) so that every
frontend resolves alike; :func:`resolve_session` asks it and says on stderr which session a
prefix or the default chose. :data:`SESSION_REF` is the click parameter type of every
session argument and option; its ``shell_complete`` lists the names and ids the daemon holds.

Stub (issue 15, room names fills it in): the reference is returned as given.
"""

from __future__ import annotations

from typing import Any, Callable

import click

from client.cli.terminal import note

__all__ = ["SESSION_REF", "resolve_session"]


class SessionRef(click.ParamType):
    """A session reference (module doc)."""

    name = "session"


SESSION_REF = SessionRef()


async def resolve_session(client: Any, ref: str | None, *, cwd: str | None = None,
                          say: Callable[[str], None] = note) -> str:
    """The id of the session ``ref`` names (module doc)."""
    if ref is None:
        raise click.UsageError("name a session")
    return ref
