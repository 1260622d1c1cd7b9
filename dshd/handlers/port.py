"""The session room's refusals as ``dshd.errors`` classes, with the sentence each one sends.

Theory of operation: handlers reach sessions through the narrow port (``SessionRegistry.get``
``create``, ``Session.start_call`` ``decide``, ``TurnDriver``). Where a port call still
raises an exception of its own room (``SessionNotFound`` of the registry, ``CallLimit``,
``AlreadyDecided`` of the approval gate, ``TurnBusy``...), the wrapper here raises the
``dshd.errors`` class it stands for, with the message and ``data`` PROTOCOL.md gives it, so the
dispatcher's one map (``dshd.errors.to_rpc_error``) sees only the tree. This is the only module
of the package that catches the port's exceptions; when a raise site in ``dshd/sessions`` or
``dshd/agent`` raises its ``dshd.errors`` class itself, its wrapper here shrinks to the call.
"""

from __future__ import annotations

from typing import Any

from .. import errors
from ..agent import NoTurn, SteerLimit, TurnBusy, TurnDriver
from ..approval import AlreadyDecided, ApprovalNotFound
from ..paths import is_valid_id
from ..sessions.registry import SessionLimit, SessionNotFound
from ..sessions.session import CallLimit
from ..storage.errors import LockHeld, LogCorrupt, LogTooNew, StateDirMoved
from .context import ConnectionPort, may_use

__all__ = [
    "cancel_turn", "create_session", "decide", "open_session", "start_call", "start_turn",
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
    except SessionNotFound:
        raise errors.SessionNotFound(
            f"session {session_id} not found; `dsh sessions` lists the sessions") from None
    except LockHeld as exc:
        raise errors.SessionLocked(
            f"session {session_id} is locked by another process: {exc}") from None
    except StateDirMoved as exc:
        raise errors.StorageFailure(f"session {session_id} cannot be opened: {exc}") from None
    except OSError as exc:
        raise errors.StorageFailure(
            f"session {session_id} cannot be opened: {exc.strerror or exc} ({exc.filename}); "
            "check the state directory's permissions and free space",
        ) from None
    except (LogCorrupt, LogTooNew) as exc:
        raise errors.StorageFailure(f"session {session_id} cannot be opened: {exc}",
                                    {"code": "LOG_DAMAGED"}) from None
    except SessionLimit as exc:
        raise errors.LimitExceeded(str(exc)) from None
    if not may_use(conn, session.owner):
        raise errors.PermissionDenied(f"session {session_id} belongs to another user")
    return session


async def create_session(conn: ConnectionPort, cwd: str, title: str | None,
                         policy: str | None, sandbox: str | None,
                         env: dict[str, str] | None) -> Any:
    """A new session owned by the connection's user (-32013 past ``max_sessions``)."""
    try:
        return await conn.daemon.registry.create(cwd, title, policy, sandbox, env,
                                                 owner=conn.uid)
    except SessionLimit as exc:
        raise errors.LimitExceeded(str(exc)) from None
    except StateDirMoved as exc:
        raise errors.StorageFailure(f"no session created: {exc}") from None


def start_call(session: Any, call_id: str, name: str, arguments: dict, approved: bool) -> None:
    """Record ``tool/call`` and start the call (-32013 CALL_LIMIT, nothing recorded)."""
    try:
        session.start_call(call_id, name, arguments, approved)
    except CallLimit as exc:
        raise errors.LimitExceeded(
            f"{exc}; nothing was recorded. Wait for a call to settle (tool.wait) and retry",
            {"code": "CALL_LIMIT"},
        ) from None


def decide(session: Any, session_id: str, approval_id: str, decision: str) -> str:
    """Decide a pending approval; the outcome (-32011 with ``data.outcome``, -32007)."""
    try:
        return session.decide(approval_id, decision)
    except AlreadyDecided as exc:
        raise errors.AlreadyDecided(
            f"approval {approval_id} was already decided: {exc.outcome}",
            {"outcome": exc.outcome},
        ) from None
    except ApprovalNotFound:
        raise errors.ApprovalNotFound(
            f"approval {approval_id} not found in session {session_id}") from None


def start_turn(session: Any, session_id: str, text: str) -> str:
    """Start a turn; its id (-32013 TURN_RUNNING when one runs)."""
    try:
        return TurnDriver.of(session).start(text)
    except TurnBusy as exc:
        raise errors.LimitExceeded(
            f"session {session_id} already runs turn {exc.turn_id}; steer it with turn.steer "
            "or stop it with turn.cancel",
            {"code": "TURN_RUNNING", "turnId": exc.turn_id},
        ) from None


def steer_turn(session: Any, session_id: str, text: str) -> str:
    """Queue ``text`` for the running turn; its id (-32602 NO_TURN, -32013 past the queue)."""
    try:
        return TurnDriver.of(session).steer(text)
    except NoTurn:
        raise errors.InvalidParams(
            f"no turn is running in session {session_id}; start one with turn.start",
            code="NO_TURN") from None
    except SteerLimit as exc:
        raise errors.LimitExceeded(f"{exc}; wait for the next step") from None


def cancel_turn(session: Any) -> bool:
    """Cancel the running turn; False when none runs."""
    return TurnDriver.of(session).cancel()
