"""Subscriptions (PROTOCOL.md §3.3): subscribe and unsubscribe.

Theory of operation: a subscription belongs to the connection that made it
(``conn.subscriptions``) and follows one session's lane. ``subscribe`` answers the new id and
attaches the subscription only once that answer is queued (:class:`AfterResponse`), so the
response precedes the base batch on the wire; a connection that said
``capabilities.approvals`` attaches as an approval answerer. A connection holds at most
:data:`MAX_SUBSCRIPTIONS_PER_CONNECTION` (each keeps an encoder and a lane copy's worth of
state in flight); one more is ``-32013``, nothing attached.
"""

from __future__ import annotations

from protocol import methods as m

from ..errors import InvalidParams, LimitExceeded
from ..sessions.streams import Subscription
from . import port
from .context import AfterResponse, ConnectionPort

__all__ = ["MAX_SUBSCRIPTIONS_PER_CONNECTION", "subscribe", "unsubscribe"]

#: Subscriptions one connection may hold at once (PROTOCOL.md §5).
MAX_SUBSCRIPTIONS_PER_CONNECTION = 256


async def subscribe(conn: ConnectionPort, p: m.SubscribeParams) -> AfterResponse:
    if len(conn.subscriptions) >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
        raise LimitExceeded(
            f"limit exceeded: this connection already holds {len(conn.subscriptions)} "
            f"subscriptions (at most {MAX_SUBSCRIPTIONS_PER_CONNECTION}); unsubscribe from "
            "one first, or use another connection")
    session = await port.open_session(conn, p.session_id)
    sub = Subscription(conn.daemon.mint_subscription_id(), session.id, conn)
    conn.subscriptions[sub.id] = sub
    answerer = bool(conn.capabilities.get("approvals"))
    return AfterResponse(
        m.SubscribeResult(subscription_id=sub.id),
        lambda: session.subscribe(sub, answerer=answerer),
    )


async def unsubscribe(conn: ConnectionPort, p: m.UnsubscribeParams) -> m.EmptyResult:
    sub = conn.subscriptions.pop(p.subscription_id, None)
    if sub is None:
        raise InvalidParams(f"no subscription {p.subscription_id!r} on this connection",
                            field="subscriptionId")
    sub.end()
    session = conn.daemon.registry.opened(sub.session_id)
    if session is not None:
        session.unsubscribe(sub)
    return m.EmptyResult()
