"""A live mirror of one session's lane view that survives gaps and overflow (PROTOCOL.md §3.3).

Theory of operation: ``open`` sends ``subscribe`` (through the client's one request path,
``Client.request``) and registers an ``Inbox`` for the new
``subscriptionId`` from inside the reader (the ``on_result`` hook), so the base batch that
follows the response lands in it. Iterating takes batches from the inbox and feeds them to a
``Mirror``. When the mirror breaks (seq gap, decode or apply error) or the inbox overflowed
(the client fell behind), the subscription quietly subscribes again, unsubscribes the old one
(in that order: an approval answerer stays attached throughout) and carries on from the new
base batch: the consumer sees the current view again, never a broken one.
``resubscribes`` counts those restarts; ``mirror.last_ops`` tells how the last batch changed the
value (a base batch starts with ``r``). The view is the plain JSON value the batches build
(``protocol.mirror``), not a struct: ops apply to JSON. Too many restarts in a row without one good batch raise
``MirrorBroken`` rather than loop forever.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol

import anyio
import msgspec

from client.transport import (
    DEFAULT_INBOX_BOUND, Connection, ConnectionLost, Inbox, InboxOverflow,
)
from protocol.methods import SubscribeParams, SubscribeResult, UnsubscribeParams
from protocol.mirror import Mirror, MirrorBroken
from protocol.rpc import RpcError

__all__ = ["Subscription", "MAX_RESTARTS_IN_A_ROW"]

#: Restarts without a single good batch in between before giving up.
MAX_RESTARTS_IN_A_ROW = 8


class Requester(Protocol):
    """How a subscription sends ``subscribe`` / ``unsubscribe``: ``Client.request``."""

    def __call__(self, method: str, params: msgspec.Struct | None = None, *,
                 on_result: Callable[[Any], None] | None = None) -> Awaitable[Any]: ...


class Subscription:
    """Iterate it (``async for view in sub``) to get the lane view after each batch.

    The view is the mirror's own value, changed in place by later batches: copy what you keep.
    """

    def __init__(self, conn: Connection, session_id: str, *, request: Requester,
                 bound: int = DEFAULT_INBOX_BOUND) -> None:
        self._conn = conn  # routing of its stream notifications only
        self._request = request
        self.session_id = session_id
        self._bound = bound
        self._inbox: Inbox | None = None
        self.subscription_id: str | None = None
        self.mirror = Mirror()
        self.resubscribes = 0
        #: Why the last restart happened (a ``MirrorBroken`` or ``InboxOverflow``), or None.
        self.last_restart_reason: Exception | None = None
        self._restarts_in_a_row = 0
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------
    async def open(self) -> None:
        """Send ``subscribe``; the base batch follows."""
        inbox = Inbox(self._bound)

        def register(result: SubscribeResult) -> None:
            self._conn.register_inbox(result.subscription_id, inbox)

        result = await self._request("subscribe", SubscribeParams(session_id=self.session_id),
                                     on_result=register)
        self.subscription_id = result.subscription_id
        self._inbox = inbox
        self.mirror.reset()

    async def resubscribe(self, reason: Exception | None = None) -> None:
        """Drop the current subscription and start a new one (a fresh base batch)."""
        self._restarts_in_a_row += 1
        if self._restarts_in_a_row > MAX_RESTARTS_IN_A_ROW:
            raise MirrorBroken(
                f"gave up after {MAX_RESTARTS_IN_A_ROW} resubscribes in a row: {reason}"
            )
        self.resubscribes += 1
        self.last_restart_reason = reason
        # Make before break: the new subscription exists before the old one ends, so that an
        # approval answerer never leaves the session in between (its last subscription gone
        # would settle every pending approval as ``unavailable``, PROTOCOL.md §3.4).
        old_id = self.subscription_id
        self.subscription_id, self._inbox = None, None
        if old_id is not None:
            self._conn.drop_inbox(old_id)  # stop routing now, unsubscribe once replaced
        try:
            await self.open()
        finally:
            await self._drop(old_id)

    async def aclose(self) -> None:
        """Unsubscribe (best effort, bounded); the connection stays open."""
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(2, shield=True):
            await self._unsubscribe()

    async def __aenter__(self) -> "Subscription":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _unsubscribe(self) -> None:
        sub_id, self.subscription_id, self._inbox = self.subscription_id, None, None
        await self._drop(sub_id)

    async def _drop(self, sub_id: str | None) -> None:
        if sub_id is None:
            return
        self._conn.drop_inbox(sub_id)
        if self._conn.closed:
            return
        try:
            await self._request("unsubscribe", UnsubscribeParams(subscription_id=sub_id))
        except RpcError:
            pass  # already gone on the daemon's side: nothing left to undo
        except ConnectionLost:
            pass  # the connection ended meanwhile: the daemon dropped the subscription with it

    # -- consuming -----------------------------------------------------------------------
    async def next_view(self) -> Any:
        """Wait for the next batch, apply it and return the view (restarting when needed)."""
        while True:
            if self._closed:
                raise anyio.ClosedResourceError("subscription is closed")
            if self._inbox is None:
                await self.open()
            assert self._inbox is not None
            try:
                seq, ops = await self._inbox.get()
            except InboxOverflow as exc:
                await self.resubscribe(exc)
                continue
            try:
                self.mirror.feed(seq, ops)
            except MirrorBroken as exc:
                await self.resubscribe(exc)
                continue
            self._restarts_in_a_row = 0
            return self.mirror.value

    def __aiter__(self) -> "Subscription":
        return self

    async def __anext__(self) -> Any:
        return await self.next_view()

    def views(self) -> "Subscription":
        """``async for view in sub.views()`` -- the same as iterating ``sub``."""
        return self
