"""How handlers reach the session room, and the refusals that only a handler can word.

Theory of operation: handlers reach sessions through the narrow port (``SessionRegistry.get``
``create``, ``Session.start_call``, ``Session.approvals``, ``TurnDriver``). The session room raises its
refusals as ``dshd.errors`` classes carrying their sentence and ``data``, so most port calls
here are bare and the dispatcher's one map (``dshd.errors.to_rpc_error``) answers them. Only
opening a session adds context a lower room cannot know: the storage layer's ``LockHeld``,
``StateDirMoved``, ``OSError`` and damaged-log errors get the session's id and what to do
(PROTOCOL.md §3), and the ownership check (-32001) runs on the opened session.
"""

from __future__ import annotations

from typing import Any

from .. import errors
from ..agent import TurnDriver
from ..paths import is_valid_id
from ..storage.errors import LockHeld, LogCorrupt, LogTooNew, StateDirMoved
from .context import ConnectionPort, may_use

__all__ = [
    "cancel_turn", "create_session", "delete_session", "open_session", "start_call",
    "start_turn",
    "steer_turn",
]


async def open_session(conn: ConnectionPort, session_id: str) -> Any:
    """The session ``session_id`` for ``conn``, opened for writing if it is not open
    (PROTOCOL.md §3: -32602 bad id, -32004, -32005, -32014 with LOG_DAMAGED, -32013, -32001)."""
    if not is_valid_id(session_id):
        raise errors.InvalidParams(
            f"invalid sessionId {session_id!r}: ids match [A-Za-z0-9_-]{{1,64}}",
            field="sessionId",
        )
    try:
        session = await conn.daemon.registry.get(session_id)
    except LockHeld as exc:
        raise errors.SessionLocked(
            f"session {session_id} is locked by another process: {exc}") from None
    except StateDirMoved as exc:
        raise errors.StorageFailure(f"session {session_id} cannot be opened: {exc}") from None
    except OSError as exc:
        fds = errors.out_of_files(exc)
        raise errors.StorageFailure(
            f"session {session_id} cannot be opened: {exc.strerror or exc} ({exc.filename}); "
            + (fds or "check the state directory's permissions and free space"),
            {"code": "TOO_MANY_FILES"} if fds else None,
        ) from None
    except (LogCorrupt, LogTooNew) as exc:
        raise errors.StorageFailure(f"session {session_id} cannot be opened: {exc}",
                                    {"code": "LOG_DAMAGED"}) from None
    if not may_use(conn, session.owner):
        raise errors.PermissionDenied(f"session {session_id} belongs to another user")
    return session


async def create_session(conn: ConnectionPort, cwd: str, title: str | None,
                         policy: str | None, sandbox: str | None,
                         env: dict[str, str] | None, name: str | None = None) -> Any:
    """A new session owned by the connection's user (-32013 past ``max_sessions``; -32602
    NAME_TAKEN when ``name`` is another session's of this user)."""
    try:
        return await conn.daemon.registry.create(cwd, title, policy, sandbox, env,
                                                 owner=conn.uid, name=name)
    except StateDirMoved as exc:
        raise errors.StorageFailure(f"no session created: {exc}") from None


async def delete_session(conn: ConnectionPort, session_id: str, force: bool) -> dict:
    """Delete a session the caller may delete (-32013 SESSION_BUSY without ``force``)."""
    try:
        return await conn.daemon.registry.delete(session_id, force=force, by=conn.uid,
                                                 why="session.delete")
    except LockHeld as exc:
        raise errors.SessionLocked(
            f"session {session_id} is locked by another process: {exc}") from None


def start_call(session: Any, call_id: str, name: str, arguments: dict, approved: bool,
               ask_timeout: float = 0.0) -> None:
    """Record ``tool/call`` and start the call (-32013 CALL_LIMIT, nothing recorded);
    ``ask_timeout``: seconds its gate waits for an answerer (PROTOCOL.md §3.4)."""
    session.start_call(call_id, name, arguments, approved, ask_timeout=ask_timeout)


def start_turn(session: Any, session_id: str, text: str,
               ask_grace: float | None = None) -> str:
    """Start a turn; its id (-32013 TURN_RUNNING when one runs). ``ask_grace``: its calls'
    grace for an answerer (None: ``turn_ask_grace_seconds``)."""
    return TurnDriver.of(session).start(text, ask_grace)


def steer_turn(session: Any, session_id: str, text: str) -> str:
    """Queue ``text`` for the running turn; its id (-32602 NO_TURN, -32013 past the queue)."""
    return TurnDriver.of(session).steer(text)


def cancel_turn(session: Any) -> bool:
    """Cancel the running turn; False when none runs."""
    return TurnDriver.of(session).cancel()
