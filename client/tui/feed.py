"""The TUI's one connection to dshd: the session list, the watched session's lane, reconnects.

Theory of operation: :class:`DaemonFeed` owns ONE long-lived ``client.api`` connection (an
approval answerer: ``approvals=True``) and runs on whatever loop runs the caller -- Textual's
asyncio loop, through a worker (anyio is the client library's runtime). While connected two
tasks share it: one polls ``session.list`` every ``POLL_S`` (there is no list subscription)
and hands the list to the sink -- and, while a session other than the watched one has a
pending approval, ``approval.list`` too (``feed_approvals``; an empty list once none has); one holds a ``client.subscription.Subscription`` (which mirrors
the lane with ``protocol.mirror.Mirror`` and resubscribes on a gap) to the *watched* session
and hands each new view to the sink -- the mirror's own value, which the next batch changes in
place: the sink renders it at once (the callback runs before the next batch is applied) and
keeps strings, not the dicts (no copy per batch: a lane of 100 calls holds up to 100 output
windows). ``watch(session_id)`` switches the watched
session: the subscription task's cancel scope is cancelled and it subscribes to the new one.
Being subscribed is what makes this connection an answerer of that session (PROTOCOL.md §3.4).

When the connection is lost (dshd stopped, crashed, not started yet) the sink hears
``feed_lost(reason, retry_in)`` -- the app shows a banner -- and the feed connects again after a
back-off of ``BACKOFF_INITIAL_S`` doubling to ``BACKOFF_MAX_S``, forever (a person watching a
screen wants it back whenever dshd is; ``client.link``'s budgeted reconnect with ``DaemonGone``
suits a command that must end). On success ``feed_connected`` comes, then
``feed_resolve(client)`` (the app resolves the session it was asked to watch, before the
first poll picks a row), whoever waits in ``next_client`` gets the new client, the list is
polled again and the watched session subscribed again with a fresh base batch. An error
answer to one
request (``subscribe`` of a session that was removed) is reported with ``feed_error`` and does
not drop the connection. Anything that is not a loss (a bug) propagates.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import anyio

from client.api import Client, connect
from client.exits import leaves
from client.transport import DshClientError
from protocol.approvals import PendingApproval
from protocol.methods import SessionInfo
from protocol.rpc import RpcError

__all__ = ["DaemonFeed", "FeedSink", "POLL_S", "BACKOFF_INITIAL_S", "BACKOFF_MAX_S"]

#: How often ``session.list`` is polled while connected (seconds).
POLL_S = 1.0
#: The first wait before connecting again; it doubles up to ``BACKOFF_MAX_S`` (seconds).
BACKOFF_INITIAL_S = 0.25
BACKOFF_MAX_S = 5.0

#: What a lost connection makes its tasks raise.
_LOSS_KINDS = (DshClientError, RpcError, anyio.ClosedResourceError, anyio.BrokenResourceError,
               anyio.EndOfStream, OSError)


class FeedSink(Protocol):
    """Who hears what the feed learns (the app); every method runs on the feed's loop."""

    def feed_connected(self) -> None: ...
    async def feed_resolve(self, client: Client) -> None: ...
    def feed_lost(self, reason: str, retry_in: float) -> None: ...
    def feed_sessions(self, sessions: list[SessionInfo]) -> None: ...
    def feed_lane(self, session_id: str, lane: Any) -> None: ...
    def feed_approvals(self, pending: list[PendingApproval]) -> None: ...
    def feed_error(self, message: str) -> None: ...


def is_loss(exc: BaseException) -> bool:
    """Whether ``exc`` (maybe a task group's) means "the connection to dshd is gone"."""
    return all(isinstance(leaf, _LOSS_KINDS) for leaf in leaves(exc))


def describe(exc: BaseException) -> str:
    """One line for the banner: the first leaf's message."""
    for leaf in leaves(exc):
        text = leaf.message if isinstance(leaf, RpcError) else str(leaf)
        return text or type(leaf).__name__
    return "connection lost"


class DaemonFeed:
    """The connection keeper (module doc). ``client`` is the live client or None."""

    def __init__(self, socket: str | os.PathLike[str] | None, sink: FeedSink) -> None:
        self.socket = socket
        self.sink = sink
        self.client: Client | None = None
        self.watched: str | None = None
        self.connects = 0
        self._changed: anyio.Event | None = None
        self._watch_scope: anyio.CancelScope | None = None
        self._waiting: list[anyio.Event] = []

    def watch(self, session_id: str | None) -> None:
        """Watch (subscribe to) ``session_id`` from now on; None: none."""
        if session_id == self.watched:
            return
        self.watched = session_id
        if self._watch_scope is not None:
            self._watch_scope.cancel()
        if self._changed is not None:
            self._changed.set()

    async def next_client(self, lost: Client) -> Client:
        """The live client once there is one other than ``lost`` (waits for a reconnect)."""
        while self.client is None or self.client is lost or self.client.connection.closed:
            event = anyio.Event()
            self._waiting.append(event)
            await event.wait()
        return self.client

    def _connected(self) -> None:
        waiting, self._waiting = self._waiting, []
        for event in waiting:
            event.set()

    async def run(self) -> None:
        """Connect, feed, and connect again after each loss, until cancelled."""
        wait = BACKOFF_INITIAL_S
        while True:
            try:
                async with connect(self.socket, "dsh-tui", approvals=True) as client:
                    self.client = client
                    self.connects += 1
                    wait = BACKOFF_INITIAL_S
                    self.sink.feed_connected()
                    await self.sink.feed_resolve(client)
                    self._connected()
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(self._poll, client)
                        tasks.start_soon(self._watch_loop, client)
            except Exception as exc:  # noqa: BLE001 - re-raised unless the daemon went away
                if not is_loss(exc):
                    raise
                reason = describe(exc)
            else:
                reason = "the connection ended"
            finally:
                self.client = None
            self.sink.feed_lost(reason, wait)
            await anyio.sleep(wait)
            wait = min(wait * 2, BACKOFF_MAX_S)

    async def _poll(self, client: Client) -> None:
        asked_elsewhere = False
        while True:
            sessions = await client.list_sessions()
            self.sink.feed_sessions(sessions)
            if any(s.pending_approvals and s.session_id != self.watched for s in sessions):
                self.sink.feed_approvals(await client.approvals())
                asked_elsewhere = True
            elif asked_elsewhere:
                self.sink.feed_approvals([])
                asked_elsewhere = False
            await anyio.sleep(POLL_S)

    async def _watch_loop(self, client: Client) -> None:
        while True:
            session_id = self.watched
            if session_id is None:
                self._changed = anyio.Event()
                await self._changed.wait()
                continue
            with anyio.CancelScope() as scope:
                self._watch_scope = scope
                try:
                    await self._follow_lane(client, session_id)
                except RpcError as exc:
                    if client.connection.closed:
                        raise
                    self.sink.feed_error(f"cannot watch {session_id}: {exc.message}")
                    self._changed = anyio.Event()
                    if self.watched == session_id:
                        await self._changed.wait()
            self._watch_scope = None

    async def _follow_lane(self, client: Client, session_id: str) -> None:
        sub = await client.subscribe(session_id)
        try:
            async for view in sub:
                self.sink.feed_lane(session_id, view)
        finally:
            await sub.aclose()
