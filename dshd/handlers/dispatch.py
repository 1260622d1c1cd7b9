"""Dispatch: one classified message in, its encoded answer out; where a handler's error is mapped.

Theory of operation: :func:`dispatch` first checks the envelope (only a request or a
notification reaches a handler; a response object, or an element ``parse_message`` refused,
is answered ``-32600``), then refuses anything but ``initialize`` before the handshake
(``-32002``), looks the method up in ``protocol.methods.METHODS`` (the params struct) and in
:data:`HANDLERS` (the function), decodes the params (bad params: ``-32602`` naming the
field), runs the handler and encodes its result struct. Whatever a handler raises goes through
``dshd.errors.to_rpc_error`` here, once (the only mapping of an exception to an error
response in the daemon; what the connection refuses before a message is classified -- an
oversize line, too many requests in flight -- it answers itself): a ``dshd.errors`` class
carries its code, message and data; anything else is a bug, logged with its traceback and
answered ``-32603`` without closing the connection. A notification is never answered. One
canonical log line per message (``rpc``: conn, method, id, error, ms): at info level for an
error and for a request slower than ``log_requests_slower_than_ms``, at debug level for the
rest (so a cheap request formats no line at the default level).
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

import structlog

from protocol import methods, rpc

from ..errors import MethodNotFound, NotInitialized, to_rpc_error
from . import approvals, calls, cleanup, lifecycle, raw, sessions, streams, turns
from .context import AfterResponse, ConnectionPort

__all__ = ["Answer", "HANDLERS", "NOT_A_CALL", "dispatch"]

log = structlog.get_logger("dshd.rpc")

Handler = Callable[[ConnectionPort, Any], Awaitable[Any]]

#: Method name -> handler; its params and result structs are ``protocol.methods.METHODS``'.
HANDLERS: dict[str, Handler] = {
    "initialize": lifecycle.initialize,
    "daemon.status": lifecycle.daemon_status,
    "session.create": sessions.session_create,
    "session.list": sessions.session_list,
    "session.get": sessions.session_get,
    "session.events": sessions.session_events,
    "session.setApprovalPolicy": sessions.session_set_policy,
    "session.find": sessions.session_find,
    "session.rename": sessions.session_rename,
    "session.delete": cleanup.session_delete,
    "session.prune": cleanup.session_prune,
    "session.setSandbox": sessions.session_set_sandbox,
    "tool.run": calls.tool_run,
    "tool.wait": calls.tool_wait,
    "tool.cancel": calls.tool_cancel,
    "tool.read": raw.tool_read,
    "tool.follow": raw.tool_follow,
    "tool.unfollow": raw.tool_unfollow,
    "tool.write": raw.tool_write,
    "tool.closeStdin": raw.tool_close_stdin,
    "tool.resize": raw.tool_resize,
    "tool.signal": raw.tool_signal,
    "approval.decide": approvals.approval_decide,
    "approval.rules": approvals.approval_rules,
    "approval.revokeRule": approvals.approval_revoke_rule,
    "approval.list": approvals.approval_list,
    "turn.start": turns.turn_start,
    "turn.cancel": turns.turn_cancel,
    "turn.steer": turns.turn_steer,
    "subscribe": streams.subscribe,
    "unsubscribe": streams.unsubscribe,
}
if set(HANDLERS) != set(methods.METHODS):  # the protocol table and this one name the same
    raise ImportError(f"handlers and protocol.methods.METHODS differ: "
                      f"{sorted(set(HANDLERS) ^ set(methods.METHODS))}")

#: What :func:`dispatch` gives the connection: the encoded answer (None for a notification)
#: and what to run once that answer is queued (a subscription's attach), in this order.
Answer = tuple[bytes | None, Callable[[], None] | None]

NOT_A_CALL = (
    "invalid request: dshd answers requests and notifications; this is a response or an "
    "error object, and dshd sent no request it could answer"
)


async def _run(conn: ConnectionPort, item: rpc.Request | rpc.Notification) -> tuple[Any, Any]:
    """The handler's result and what runs after its answer is queued (None mostly)."""
    if not conn.initialized and item.method != "initialize":
        raise NotInitialized("send initialize first")
    method = methods.METHODS.get(item.method)
    if method is None:
        raise MethodNotFound(f"method {item.method!r} not found")
    params = rpc.decode_params(item.params, method.params)
    result = await HANDLERS[item.method](conn, params)
    if isinstance(result, AfterResponse):
        return result.result, result.then
    return result, None


async def dispatch(conn: ConnectionPort, item: Any) -> Answer:
    """Run one classified message and return its :data:`Answer` (module doc).

    A response object (``Response``/``ErrorResponse``: dshd never sends requests) is answered
    with ``id: null`` (its id names none of the client's requests).
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
        result, then = await _run(conn, item)
        return (rpc.encode_response(rid, result) if is_request else None), then
    except Exception as exc:  # noqa: BLE001 - mapped or logged below, never lost
        error = to_rpc_error(exc)
        if error is None:
            log.exception("rpc.internal_error", method=item.method)
            error = rpc.RpcError(rpc.INTERNAL_ERROR, "internal error in dshd; see the daemon log")
        code = error.code
        line = rpc.encode_error(rid, error.code, error.message, error.data)
        return (line if is_request else None), None
    finally:
        ms = (time.perf_counter() - started) * 1000
        quiet = code is None and ms < conn.daemon.config.log_requests_slower_than_ms
        (log.debug if quiet else log.info)(
            "rpc", conn=conn.id, method=item.method, id=rid, error=code, ms=round(ms, 2)
        )
