"""The ``max_sessions`` bound on open sessions (PROTOCOL.md §3.1), kept under concurrency.

Theory of operation: every session.create and every open from disk first takes a *place*
(:meth:`SessionBound.place`) and gives it back once the session is in the registry's
``open`` (or the open failed). Taking a place is one step under one lock (a
``trio.Condition``): while ``open`` plus the places held reach ``max_sessions``, the least
recently used idle session (no running call or turn, no subscriber, no pending approval --
``Session.idle``; or one already winding down) is closed to make room: its log stays on disk
and it reopens transparently when a request names it, as after the idle close. Only when
nothing can be closed is the request refused, ``-32013`` (``SessionLimit``) naming the bound
and what to do. Without the lock, requests in flight at once (1,500 pipelined creates) all
passed the check before any of them was counted open, so the bound did not hold and each
open session kept its files (log, lock, directory: 3 fds) until dshd ran out of them.

Places still held and sessions being created (:meth:`SessionBound.pinned`: never closed
before their first events are durable) become open and idle soon, so while any exist a
request at the bound waits for them (the condition is notified when a place is given back or
a pin dropped) instead of being refused.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

import structlog
import trio

from ..errors import SessionLimit

__all__ = ["SessionBound"]

log = structlog.get_logger("dshd.registry")


class SessionBound:
    """The bound (module doc). ``open``: the registry's open sessions (id -> Session);
    ``limit()``: ``max_sessions`` now (a reload may change it); ``last_used(id)``: trio time;
    ``close(session)``: closes it and waits until it has left ``open``."""

    def __init__(self, open_: dict, limit: Callable[[], int], last_used: Callable[[str], float],
                 close: Callable[[object], Awaitable[None]]) -> None:
        self._open = open_
        self._limit = limit
        self._last_used = last_used
        self._close = close
        self._cond = trio.Condition()
        self._held = 0
        self._pinned: set[str] = set()

    @asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        """Hold one place until the session is in ``open`` (the block's end)."""
        await self._take()
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                async with self._cond:
                    self._held -= 1
                    self._cond.notify_all()

    @asynccontextmanager
    async def pinned(self, session_id: str) -> AsyncIterator[None]:
        """``session_id`` is not closed to make room while the block runs (being created)."""
        self._pinned.add(session_id)
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                async with self._cond:
                    self._pinned.discard(session_id)
                    self._cond.notify_all()

    async def _take(self) -> None:
        async with self._cond:
            while len(self._open) + self._held >= self._limit():
                idle = [s for s in self._open.values()
                        if (s.idle() or not s.usable()) and s.id not in self._pinned]
                if idle:
                    victim = min(idle, key=lambda s: self._last_used(s.id))
                    log.info("session.evicted", session=victim.id, max_sessions=self._limit())
                    await self._close(victim)
                elif self._held or not self._pinned.isdisjoint(self._open):
                    await self._cond.wait()  # they become open and idle soon (module doc)
                else:
                    raise SessionLimit(
                        f"this daemon already holds {len(self._open)} open sessions "
                        f"(max_sessions = {self._limit()}), all of them busy (running calls, "
                        "subscribers or pending approvals); wait for calls to finish or "
                        "clients to detach, then retry, or raise max_sessions in dshd's config")
            self._held += 1
