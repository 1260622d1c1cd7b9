"""Subscriptions (PROTOCOL.md §3.3): subscribe and unsubscribe.

Theory of operation: a subscription belongs to the connection that made it
(``conn.subscriptions``) and follows one session's lane. ``subscribe`` answers the new id and
attaches the subscription only once that answer is queued (:class:`AfterResponse`), so the
response precedes the base batch on the wire; a connection that said
``capabilities.approvals`` attaches as an approval answerer.
"""

from __future__ import annotations

from protocol import methods as m

from ..errors import InvalidParams
from ..sessions.streams import Subscription
from . import port
from .context import AfterResponse, ConnectionPort

__all__ = ["subscribe", "unsubscribe"]


async def subscribe(conn: ConnectionPort, p: m.SubscribeParams) -> AfterResponse:
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
