"""Cleanup methods (PROTOCOL.md §3.1): ``session.delete`` and ``session.prune``.

Theory of operation: both go through the registry (``SessionRegistry.delete``,
``dshd.sessions.retention.prune``); this room only decides who may delete. Deleting is the
owner's, or root's and the daemon user's (in system mode the daemon user is root): a
session without a recorded owner (made before owners were recorded) only theirs. A refused
delete is ``-32001`` and changes nothing; prune lists only the caller's sessions.
"""

from __future__ import annotations

import os

from protocol import methods as m

from ..errors import PermissionDenied
from ..sessions import retention
from . import port
from .context import ConnectionPort

__all__ = ["may_delete", "session_delete", "session_prune"]


def may_delete(conn: ConnectionPort, owner: int | None) -> bool:
    """The owner, root and the daemon's own user may delete a session (module doc)."""
    return conn.uid in (0, os.geteuid()) or (owner is not None and owner == conn.uid)


async def session_delete(conn: ConnectionPort, p: m.SessionDeleteParams) -> m.SessionDeleteResult:
    session = await port.open_session(conn, p.session_id)
    if not may_delete(conn, session.owner):
        raise PermissionDenied(f"session {p.session_id} belongs to another user; only its "
                               "owner or root may delete it")
    done = await port.delete_session(conn, p.session_id, p.force)
    return m.SessionDeleteResult(deleted=True, cancelled=done["cancelled"])


async def session_prune(conn: ConnectionPort, p: m.SessionPruneParams) -> m.SessionPruneResult:
    done = await retention.prune(conn.daemon.registry, p.older_than, dry_run=p.dry_run,
                                 may_delete=lambda owner: may_delete(conn, owner),
                                 by=conn.uid, why="session.prune")
    return m.SessionPruneResult(
        deleted=done["deleted"], freed_bytes=done["freedBytes"], more=done["more"],
        skipped=[m.PruneSkip(session_id=s["sessionId"], reason=s["reason"])
                 for s in done["skipped"]])
