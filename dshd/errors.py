"""The daemon's exception tree: every error a request can end in, with its JSON-RPC code.

Theory of operation: a room that refuses something raises a :class:`DshError` subclass whose
class attribute ``CODE`` is the JSON-RPC error code of PROTOCOL.md §4 (pylsp-jsonrpc's
``JsonRpcException.CODE``), with a message that says what to do next and optional ``data``
(``field``, a symbolic ``code``, ...). No builtin exception stands for a protocol error: "call
not found" is :class:`CallNotFound`, never ``KeyError``. The dispatcher turns an exception into
an error response in one place, :func:`to_rpc_error`; everything else is a bug (``-32603``,
logged with its traceback), except an error caused by running out of file descriptors, which
says so (:func:`out_of_files`). The storage layer's own errors (``dshd.storage.errors``) are part
of this tree, so a storage failure reaching a request is ``-32014`` without a per-site mapping.
"""

from __future__ import annotations

import errno
import resource
from typing import Any, ClassVar

from protocol import rpc

__all__ = [
    "AlreadyDecided", "ApprovalNotFound", "CallLimit", "CallNotFound", "CallSettled", "DshError",
    "InvalidParams", "InvalidRequest", "LimitExceeded", "MethodNotFound", "NoTurn",
    "NotInitialized", "PermissionDenied", "SessionClosing", "SessionLimit", "SessionLocked",
    "SessionNotFound", "SteerLimit", "StillRunning", "StorageFailure", "TurnBusy",
    "UnknownTool", "UnsupportedVersion", "out_of_files", "to_rpc_error",
]


class DshError(Exception):
    """Base of every error a request may end in; ``CODE`` is its JSON-RPC code."""

    CODE: ClassVar[int] = rpc.INTERNAL_ERROR
    #: Put before the message on the wire (the storage layer's own errors say what failed).
    PREFIX: ClassVar[str] = ""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class InvalidRequest(DshError):
    CODE = rpc.INVALID_REQUEST


class MethodNotFound(DshError):
    CODE = rpc.METHOD_NOT_FOUND


class InvalidParams(DshError):
    """A param is wrong; ``field`` names it (``data.field``), ``code`` a symbolic reason."""

    CODE = rpc.INVALID_PARAMS

    def __init__(self, message: str, field: str | None = None, **data: Any) -> None:
        if field is not None:
            data["field"] = field
        super().__init__(message, data or None)


class PermissionDenied(DshError):
    CODE = rpc.PERMISSION_DENIED


class NotInitialized(DshError):
    CODE = rpc.NOT_INITIALIZED


class UnsupportedVersion(DshError):
    CODE = rpc.UNSUPPORTED_VERSION


class SessionNotFound(DshError):
    CODE = rpc.SESSION_NOT_FOUND


class SessionLocked(DshError):
    CODE = rpc.SESSION_LOCKED


class CallNotFound(DshError):
    CODE = rpc.CALL_NOT_FOUND


class CallSettled(CallNotFound):
    """The raw channel's input to a call that has settled: its command has ended (``-32006``,
    ``data.code`` ``CALL_SETTLED``; its output stays readable with ``tool.read``)."""

    def __init__(self, session_id: str, call_id: str) -> None:
        super().__init__(f"call {call_id} of session {session_id} has settled: its command "
                         "has ended and takes no input; read its output with tool.read",
                         {"code": "CALL_SETTLED"})


class ApprovalNotFound(DshError):
    CODE = rpc.APPROVAL_NOT_FOUND


class StillRunning(DshError):
    """A wait timed out; the thing waited for goes on (``-32010``)."""

    CODE = rpc.TIMEOUT


class AlreadyDecided(DshError):
    CODE = rpc.ALREADY_DECIDED


class UnknownTool(DshError):
    CODE = rpc.UNKNOWN_TOOL


class LimitExceeded(DshError):
    """A bound was reached; nothing was recorded (``-32013``)."""

    CODE = rpc.LIMIT_EXCEEDED


# -- the sessions' and the turn loop's refusals ---------------------------------------------
class CallLimit(LimitExceeded):
    """A call past ``max_calls_per_session`` or ``max_calls`` (``data.code`` ``CALL_LIMIT``);
    ``limit`` is the sentence naming the limit (a model's refused call quotes it)."""

    def __init__(self, limit: str) -> None:
        super().__init__(f"{limit}; nothing was recorded. Wait for a call to settle "
                         "(tool.wait) and retry", {"code": "CALL_LIMIT"})
        self.limit = limit


class SessionLimit(LimitExceeded):
    """``max_sessions`` are open and busy."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class TurnBusy(LimitExceeded):
    """A turn runs already (``data.code`` ``TURN_RUNNING``, ``data.turnId``)."""

    def __init__(self, session_id: str, turn_id: str) -> None:
        super().__init__(
            f"session {session_id} already runs turn {turn_id}; steer it with turn.steer "
            "or stop it with turn.cancel",
            {"code": "TURN_RUNNING", "turnId": turn_id},
        )
        self.turn_id = turn_id


class SteerLimit(LimitExceeded):
    """The running turn has its maximum of queued steers."""

    def __init__(self, turn_id: str, max_steers: int) -> None:
        super().__init__(f"turn {turn_id} already has {max_steers} queued steers; "
                         "wait for the next step")


class NoTurn(InvalidParams):
    """``turn.steer`` while no turn runs (``-32602``, ``data.code`` ``NO_TURN``)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no turn is running in session {session_id}; start one with "
                         "turn.start", code="NO_TURN")


class StorageFailure(DshError):
    """Something could not be made durable or opened (``-32014``; fail closed)."""

    CODE = rpc.STORAGE_FAILURE


class SessionClosing(StorageFailure):
    """The session is winding down (daemon stop): no new work is accepted (``-32014``,
    ``data.code`` ``SESSION_CLOSING``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, {"code": "SESSION_CLOSING"})


def out_of_files(exc: BaseException | None) -> str | None:
    """The sentence for an error caused by running out of file descriptors (``EMFILE``: this
    process's ``RLIMIT_NOFILE``; ``ENFILE``: the system's), found on ``exc`` or its causes;
    None when it is not one. The advice is about fds, never "permissions and free space"."""
    for _ in range(8):
        if exc is None:
            return None
        if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            return (f"dshd has too many files open (limit {soft}); close sessions or raise "
                    "LimitNOFILE")
        if isinstance(exc, OSError) and exc.errno == errno.ENFILE:
            return ("the system has too many files open (ENFILE); close sessions or raise "
                    "fs.file-max")
        exc = _cause(exc)
    return None


def _cause(exc: BaseException) -> BaseException | None:
    """What ``exc`` was raised from or during (not when raised ``from None``)."""
    return exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def to_rpc_error(exc: BaseException) -> rpc.RpcError | None:
    """The error response for ``exc``, or None when it is a bug (answer ``-32603``, log it).

    The one map from exceptions to JSON-RPC errors, applied by ``dshd.handlers``' dispatch and
    nowhere else: a :class:`DshError` carries its code, message (after its ``PREFIX``) and
    data; an ``RpcError`` (the params decoder's) is already one. One caused by running out of
    file descriptors (:func:`out_of_files`), a ``DshError`` or a bare ``OSError`` from any
    site, leads with that sentence and has ``data.code`` ``TOO_MANY_FILES`` (-32014 for an
    ``OSError``): dshd is short of fds, which is not a bug.
    """
    if isinstance(exc, rpc.RpcError):
        return exc
    if isinstance(exc, DshError):
        message = exc.PREFIX + exc.message
        fds = out_of_files(_cause(exc))
        if fds is None:
            return rpc.RpcError(exc.CODE, message, exc.data)
        return rpc.RpcError(exc.CODE, f"{fds} ({message})", exc.data or {"code": "TOO_MANY_FILES"})
    fds = out_of_files(exc)
    if fds is not None:
        return rpc.RpcError(rpc.STORAGE_FAILURE, f"{fds} ({exc})", {"code": "TOO_MANY_FILES"})
    return None
