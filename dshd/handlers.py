"""JSON-RPC method handlers (PROTOCOL.md §2–§3.6), and the one place errors become responses.

Theory of operation: :func:`dispatch` first checks the envelope (only a request or a
notification reaches a handler; a response object, or an element ``parse_message`` refused, is
answered ``-32600``), then looks the method up in ``METHODS``, decodes its params
into the method's msgspec struct (bad params → ``-32602`` naming the field), runs the handler
and encodes the result. Domain exceptions are mapped to JSON-RPC errors here and nowhere else;
an unexpected exception is logged with its traceback and answered ``-32603`` without closing the
connection. One canonical log line per request.

What a request may record is checked before anything is recorded, by the params structs
(``protocol.rpc``): every value a client sends that is recorded or shown is a JSON value
(OPS.md §1; ``arguments`` through ``rpc.arguments_problem``, the check the agent loop applies
to a model's calls too) and every free-form string has a cap (``rpc.MAX_*``); past either the
answer is ``-32602`` naming the field and the cap, and the session is untouched. A call past
``max_calls_per_session`` / ``max_calls`` is ``-32013``, nothing recorded.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from typing import TYPE_CHECKING, Awaitable, Callable

import structlog

from protocol import rpc

from . import __version__, identity
from .agent import TurnDriver
from .errors import DshError, to_rpc_error
from .execution.sandbox import refused_workspace
from .paths import is_valid_id, is_within
from .sessions.registry import SessionLimit, SessionNotFound
from .sessions.streams import Subscription
from .storage.errors import LockHeld, LogCorrupt, LogTooNew, StateDirMoved, StorageError

if TYPE_CHECKING:
    from .connection import Connection

log = structlog.get_logger("dshd.rpc")

TOOLS = {"bash"}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Names dshd puts in every tool's environment; a session env must not override them (EXEC.md §1).
RESERVED_ENV = frozenset({"DSH_CALL_ID", "DSH_SESSION_ID", "DSH_RUN"})


def _bad(message: str, **data) -> rpc.RpcError:
    return rpc.RpcError(rpc.INVALID_PARAMS, message, data or None)


async def _session(conn: "Connection", session_id: str):
    if not is_valid_id(session_id):
        raise _bad(
            f"invalid sessionId {session_id!r}: ids match [A-Za-z0-9_-]{{1,64}}",
            field="sessionId",
        )
    try:
        session = await conn.daemon.registry.get(session_id)
    except SessionNotFound:
        raise rpc.RpcError(
            rpc.SESSION_NOT_FOUND,
            f"session {session_id} not found; `dsh sessions` lists the sessions",
        ) from None
    except LockHeld as exc:
        raise rpc.RpcError(rpc.SESSION_LOCKED, f"session {session_id} is locked by another process: {exc}") from None
    except StateDirMoved as exc:
        raise rpc.RpcError(rpc.STORAGE_FAILURE, f"session {session_id} cannot be opened: {exc}") from None
    except OSError as exc:
        raise rpc.RpcError(
            rpc.STORAGE_FAILURE,
            f"session {session_id} cannot be opened: {exc.strerror or exc} ({exc.filename}); "
            "check the state directory's permissions and free space",
        ) from None
    except (LogCorrupt, LogTooNew) as exc:
        raise rpc.RpcError(
            rpc.STORAGE_FAILURE, f"session {session_id} cannot be opened: {exc}",
            {"code": "LOG_DAMAGED"},
        ) from None
    except SessionLimit as exc:
        raise rpc.RpcError(rpc.LIMIT_EXCEEDED, str(exc)) from None
    if not may_use(conn, session.owner):
        raise rpc.RpcError(rpc.PERMISSION_DENIED, f"session {session_id} belongs to another user")
    return session


def may_use(conn: "Connection", owner: int | None) -> bool:
    """Root, the daemon's own user and the session's owner may use a session (system mode)."""
    return conn.uid in (0, os.geteuid()) or owner is None or owner == conn.uid


# ---------------------------------------------------------------------- lifecycle
async def initialize(conn: "Connection", p: rpc.InitializeParams) -> dict:
    if conn.initialized:
        raise rpc.RpcError(rpc.INVALID_REQUEST, "initialize was already called on this connection")
    if p.protocolVersion != 1:
        raise rpc.RpcError(
            rpc.UNSUPPORTED_VERSION,
            f"protocol version {p.protocolVersion} is not supported; this dshd speaks 1",
            {"supported": [1]},
        )
    conn.initialized = True
    conn.client = dict(p.client or {})
    conn.capabilities = dict(p.capabilities or {})
    sandbox = conn.daemon.sandbox.describe()
    return {
        "protocolVersion": 1,
        "server": {"name": "dshd", "version": __version__},
        "sandbox": {"provider": sandbox["provider"], "completeness": sandbox["completeness"]},
        "tools": sorted(TOOLS),
    }


async def daemon_status(conn: "Connection", p: rpc.EmptyParams) -> dict:
    return conn.daemon.status()


# ---------------------------------------------------------------------- sessions
async def session_create(conn: "Connection", p: rpc.SessionCreateParams) -> dict:
    if not os.path.isabs(p.cwd):
        raise _bad(f"cwd must be an absolute directory, got {p.cwd!r}", field="cwd")
    if not os.path.isdir(p.cwd):
        raise _bad(f"cwd {p.cwd!r} is not an existing directory", field="cwd")
    for key, value in (p.env or {}).items():
        if not ENV_NAME.fullmatch(key) or "\0" in value:
            raise _bad(
                f"env has an invalid entry {key!r}: names are shell names ([A-Za-z_][A-Za-z0-9_]*), "
                "values have no NUL",
                field="env",
            )
        if key in RESERVED_ENV:
            raise _bad(
                f"env may not set {key!r}: dshd sets DSH_CALL_ID, DSH_SESSION_ID and DSH_RUN "
                "itself (they mark a call and its processes)",
                field="env",
            )
    # Stored resolved: each call pins this path by fd and refuses one that leads elsewhere
    # (EXEC.md §3), so a symlinked cwd would be refused at every call.
    cwd = os.path.realpath(p.cwd)
    if is_within(cwd, conn.daemon.state_dir):
        raise _bad(f"cwd {cwd!r} lies inside dshd's state directory; pick a project directory",
                   field="cwd")
    if refusal := refused_workspace(os.path.normpath(p.cwd)) or refused_workspace(cwd):
        raise _bad(refusal, field="cwd")
    if not identity.can_enter(cwd, conn.uid):
        raise rpc.RpcError(rpc.PERMISSION_DENIED,
                           f"cwd {cwd!r} is not a directory you can enter; tools run as you")
    try:
        session = await conn.daemon.registry.create(
            cwd, p.title, p.approvalPolicy, p.sandbox, p.env, owner=conn.uid
        )
    except SessionLimit as exc:
        raise rpc.RpcError(rpc.LIMIT_EXCEEDED, str(exc)) from None
    except StateDirMoved as exc:
        raise rpc.RpcError(rpc.STORAGE_FAILURE, f"no session created: {exc}") from None
    return {"sessionId": session.id}


async def session_list(conn: "Connection", p: rpc.EmptyParams) -> dict:
    sessions = await conn.daemon.registry.list()
    return {"sessions": [s for s in sessions if may_use(conn, s.get("owner"))]}


async def session_get(conn: "Connection", p: rpc.SessionGetParams) -> dict:
    return (await _session(conn, p.sessionId)).info()


async def session_events(conn: "Connection", p: rpc.SessionEventsParams) -> dict:
    session = await _session(conn, p.sessionId)
    events = session.events(p.afterSeq, p.limit)
    return {"events": events, "lastSeq": session.last_seq}


async def session_set_policy(conn: "Connection", p: rpc.SetApprovalPolicyParams) -> dict:
    session = await _session(conn, p.sessionId)
    await session.set_policy(p.policy, source="session.setApprovalPolicy")
    return {}


# ---------------------------------------------------------------------- tools
def _check_bash_arguments(arguments: dict) -> None:
    command = arguments.get("command")
    if not isinstance(command, str) or not command:
        raise _bad("bash needs arguments.command, a non-empty string", field="arguments.command")
    if "\0" in command:
        raise _bad("arguments.command must not contain a NUL character (a shell cannot run one)",
                   field="arguments.command")
    timeout = arguments.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 7 * 86400
    ):
        raise _bad("arguments.timeout is seconds, a number > 0 (at most 7 days)", field="arguments.timeout")


async def tool_run(conn: "Connection", p: rpc.ToolRunParams) -> dict:
    if p.callId is not None and not is_valid_id(p.callId):
        raise _bad(f"invalid callId {p.callId!r}: ids match [A-Za-z0-9_-]{{1,64}}", field="callId")
    session = await _session(conn, p.sessionId)
    if p.name not in TOOLS:
        raise rpc.RpcError(rpc.UNKNOWN_TOOL, f"unknown tool {p.name!r}; known: {sorted(TOOLS)}")
    _check_bash_arguments(p.arguments)
    call_id = p.callId or ("c-" + secrets.token_hex(6))
    if session.has_call(call_id):
        return {"callId": call_id, "existing": True}
    try:
        session.start_call(call_id, p.name, p.arguments, p.approved)  # CallLimit: -32013
    except StorageError as exc:
        raise rpc.RpcError(rpc.STORAGE_FAILURE, str(exc)) from None
    return {"callId": call_id}


async def tool_wait(conn: "Connection", p: rpc.ToolWaitParams) -> dict:
    session = await _session(conn, p.sessionId)
    result = await session.wait_result(p.callId, p.timeout)  # CallNotFound: -32006
    if result is None:
        raise rpc.RpcError(rpc.TIMEOUT, f"call {p.callId} is still running after {p.timeout} s; wait again")
    return result


async def tool_cancel(conn: "Connection", p: rpc.ToolCancelParams) -> dict:
    session = await _session(conn, p.sessionId)
    return {"cancelled": session.cancel_call(p.callId)}  # CallNotFound: -32006


# ---------------------------------------------------------------------- streams
async def subscribe(conn: "Connection", p: rpc.SubscribeParams) -> dict:
    session = await _session(conn, p.sessionId)
    sub = Subscription(conn.daemon.mint_subscription_id(), session.id, conn)
    conn.subscriptions[sub.id] = sub
    answerer = bool(conn.capabilities.get("approvals"))
    # The response must precede the base batch on the wire: attach after it is queued.
    return AfterResponse(
        {"subscriptionId": sub.id}, lambda: session.subscribe(sub, answerer=answerer)
    )


async def unsubscribe(conn: "Connection", p: rpc.UnsubscribeParams) -> dict:
    sub = conn.subscriptions.pop(p.subscriptionId, None)
    if sub is None:
        raise _bad(f"no subscription {p.subscriptionId!r} on this connection", field="subscriptionId")
    session = conn.daemon.registry.opened(sub.session_id)
    if session is not None:
        session.unsubscribe(sub)
    return {}


class AfterResponse:
    """A result whose ``then`` runs right after the response line is queued (for a request in
    a batch: after the batch's one array is queued)."""

    def __init__(self, result: object, then: Callable[[], None]) -> None:
        self.result = result
        self.then = then


# ---------------------------------------------------------------------- approvals
async def approval_decide(conn: "Connection", p: rpc.ApprovalDecideParams) -> dict:
    session = await _session(conn, p.sessionId)
    # AlreadyDecided (-32011) and ApprovalNotFound (-32007) pass through to dispatch.
    outcome = session.decide(p.approvalId, p.decision)
    return {"outcome": outcome}


# ---------------------------------------------------------------------- turns
async def turn_start(conn: "Connection", p: rpc.TurnStartParams) -> dict:
    if not p.input.strip():
        raise _bad("input must be a non-empty string", field="input")
    session = await _session(conn, p.sessionId)
    return {"turnId": TurnDriver.of(session).start(p.input)}  # TurnBusy: -32013


async def turn_cancel(conn: "Connection", p: rpc.TurnCancelParams) -> dict:
    session = await _session(conn, p.sessionId)
    return {"cancelled": TurnDriver.of(session).cancel()}


async def turn_steer(conn: "Connection", p: rpc.TurnSteerParams) -> dict:
    if not p.input.strip():
        raise _bad("input must be a non-empty string", field="input")
    session = await _session(conn, p.sessionId)
    # NoTurn (-32602) and SteerLimit (-32013) pass through to dispatch.
    return {"turnId": TurnDriver.of(session).steer(p.input), "queued": True}


Handler = Callable[["Connection", object], Awaitable[object]]

METHODS: dict[str, tuple[type, Handler]] = {
    "initialize": (rpc.InitializeParams, initialize),
    "daemon.status": (rpc.EmptyParams, daemon_status),
    "session.create": (rpc.SessionCreateParams, session_create),
    "session.list": (rpc.EmptyParams, session_list),
    "session.get": (rpc.SessionGetParams, session_get),
    "session.events": (rpc.SessionEventsParams, session_events),
    "session.setApprovalPolicy": (rpc.SetApprovalPolicyParams, session_set_policy),
    "tool.run": (rpc.ToolRunParams, tool_run),
    "tool.wait": (rpc.ToolWaitParams, tool_wait),
    "tool.cancel": (rpc.ToolCancelParams, tool_cancel),
    "approval.decide": (rpc.ApprovalDecideParams, approval_decide),
    "turn.start": (rpc.TurnStartParams, turn_start),
    "turn.cancel": (rpc.TurnCancelParams, turn_cancel),
    "turn.steer": (rpc.TurnSteerParams, turn_steer),
    "subscribe": (rpc.SubscribeParams, subscribe),
    "unsubscribe": (rpc.UnsubscribeParams, unsubscribe),
}


#: What :func:`dispatch` gives the connection: the encoded answer (None for a notification)
#: and what to run once that answer is queued (a subscription's attach), in this order.
Answer = tuple[bytes | None, Callable[[], None] | None]

NOT_A_CALL = (
    "invalid request: dshd answers requests and notifications; this is a response or an "
    "error object, and dshd sent no request it could answer"
)


async def dispatch(conn: "Connection", item) -> Answer:
    """Run one classified message and return its :data:`Answer`.

    The envelope is checked before anything else: an element ``parse_message`` refused, and
    any answer object (``Response``/``ErrorResponse``: dshd never sends requests), becomes a
    ``-32600`` here, so only a ``Request`` or ``Notification`` reaches a handler. A response
    object is answered with ``id: null`` (its id names none of the client's requests).
    """
    if isinstance(item, rpc.RpcError):  # not a valid message (or a whole line refused)
        return rpc.encode_error(item.id, item.code, item.message, item.data), None
    if not isinstance(item, (rpc.Request, rpc.Notification)):
        log.info("rpc", conn=conn.id, method=None, id=None, error=rpc.INVALID_REQUEST)
        return rpc.encode_error(None, rpc.INVALID_REQUEST, NOT_A_CALL), None
    is_request = isinstance(item, rpc.Request)
    rid = item.id if is_request else None
    started = time.perf_counter()
    code = None
    try:
        if not conn.initialized and item.method != "initialize":
            raise rpc.RpcError(rpc.NOT_INITIALIZED, "send initialize first")
        entry = METHODS.get(item.method)
        if entry is None:
            raise rpc.RpcError(rpc.METHOD_NOT_FOUND, f"method {item.method!r} not found")
        params_type, handler = entry
        params = rpc.decode_params(item.params, params_type)
        result = await handler(conn, params)
        then = None
        if isinstance(result, AfterResponse):
            result, then = result.result, result.then
        return (rpc.encode_response(rid, result) if is_request else None), then
    except rpc.RpcError as exc:
        code = exc.code
        return (rpc.encode_error(rid, exc.code, exc.message, exc.data) if is_request else None), None
    except StorageError as exc:
        code = rpc.STORAGE_FAILURE
        return (rpc.encode_error(rid, code, f"storage failure: {exc}") if is_request else None), None
    except DshError as exc:  # the sessions' and the agent's refusals (dshd.errors)
        err = to_rpc_error(exc)
        assert err is not None
        code = err.code
        return (rpc.encode_error(rid, err.code, err.message, err.data) if is_request else None), None
    except Exception:
        code = rpc.INTERNAL_ERROR
        log.exception("rpc.internal_error", method=item.method)
        line = rpc.encode_error(rid, code, "internal error in dshd; see the daemon log")
        return (line if is_request else None), None
    finally:
        log.info(
            "rpc",
            conn=conn.id,
            method=item.method,
            id=rid,
            error=code,
            ms=round((time.perf_counter() - started) * 1000, 2),
        )
