"""Which session the TUI watches: the reference given at start, resolved once connected, and
what to say when the watched session goes away.

Theory of operation: ``dsh tui`` resolves SESSION before the screen starts
(``client.cli.tui.pick_session``); when dshd was not reachable then, the app gets the
reference as typed and :func:`resolve_wanted` resolves it on the first connection, before the
first poll picks a row -- the daemon's ``session.find`` (PROTOCOL.md §3.1), as every ``dsh``
command resolves: an id, a name or a unique prefix; with no reference the newest session of
the app's directory. What it cannot resolve is a sentence for the screen (a notification),
never a silent switch: the app then watches the newest session and says so.
:func:`removed_text` is the sentence for a watched session that left the list (``dsh rm``).
"""

from __future__ import annotations

import os
from typing import Any

from protocol.methods import SessionInfo
from protocol.rpc import SESSION_NOT_FOUND, RpcError

__all__ = ["resolve_wanted", "removed_text"]


async def resolve_wanted(client: Any, ref: str | None) -> tuple[str | None, str | None]:
    """``(session id to watch, or None: the newest; what to tell, or None)`` for ``ref`` (None:
    the newest session of the current directory, said nothing when it has none)."""
    if "session.find" not in getattr(getattr(client, "server", None), "methods", ("session.find",)):
        return ref, None  # an older dshd: a reference is an exact id (or a name) there
    cwd = None
    if ref is None:
        try:
            cwd = os.path.realpath(os.getcwd())
        except OSError:
            return None, None
    try:
        session_id, _how, _name = await client.find_session_named(ref, cwd)
    except RpcError as exc:
        if exc.code != SESSION_NOT_FOUND:
            raise
        if ref is None:
            return None, None  # no session in this directory: the newest
        return None, f"{exc.message}; watching the newest session instead"
    return session_id, None


def removed_text(gone: SessionInfo) -> str:
    """The notification for the watched session ``gone``, no longer listed."""
    name = gone.name if isinstance(gone.name, str) else None
    named = f" ({name})" if name else ""
    return f"session {gone.session_id}{named} was removed; watching another session"
