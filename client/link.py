"""A connection to dshd that can be opened again: how ``dsh run``, ``dsh attach`` and ``dsh
wait`` ride through a daemon restart (HOST.md §7: calls outlive the daemon).

Theory of operation: a ``Link`` holds one ``client.api.Client`` at a time. Each connection
lives in a *keeper* task of the link's own task group (``open_link``): the keeper enters
``client.api.connect``, hands the client over (``TaskGroup.start``) and holds the connection
until the link lets it go, so a connection is opened and closed in one task whatever the
caller's cancel scopes are doing meanwhile.

``lost(exc)`` tells whether an exception that ended a caller's work means "the daemon went
away" -- the current connection is closed and every leaf of the (task-group) exception is a
client error, a daemon error answer or a stream error, never an interrupt or a bug -- and
``reconnect(say)`` then opens a new connection: at once, then after a back-off of
``BACKOFF_INITIAL_S`` doubling to ``BACKOFF_MAX_S``, each attempt bounded by what is left of
the outage's budget (``timeout``, ``--reconnect-timeout``). It says ONE line when the
outage begins and one when dshd is back; past the budget it raises ``DaemonGone`` (exit 75:
the call may or may not have ended; ``client.exits``), whose line says the budget this
outage really had (what was left of an earlier one's, when shared: below). A link with ``timeout == 0`` never
reconnects: ``lost`` is always False and a lost connection ends the command as before. An
outage that begins less than ``STABLE_S`` after the last one ended goes on with that
outage's budget (a daemon that accepts and drops at once cannot keep dsh looping forever).

``ride(link, body, say)`` is the simple pattern: run ``body(client)``; when the connection was
lost, reconnect and run it again from the start (for bodies that print nothing before they
end, or that keep their own progress). A hand-written loop, not ``stamina`` (a dependency of
the daemon's model client): stamina's default instrumentation logs every retry through
structlog to stderr, and turning that off is process-global state.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
import anyio.abc

from client.api import Client, DaemonGone, connect
from client.exits import leaves
from client.transport import DshClientError
from protocol.rpc import RpcError

__all__ = ["Link", "DaemonGone", "open_link", "ride", "DEFAULT_RECONNECT_TIMEOUT",
           "BACKOFF_INITIAL_S", "BACKOFF_MAX_S", "STABLE_S"]

#: ``--reconnect-timeout``'s default (seconds).
DEFAULT_RECONNECT_TIMEOUT = 30.0
#: The first wait between two connection attempts; it doubles up to ``BACKOFF_MAX_S``.
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 2.0
#: A connection that lived less than this continues the previous outage's budget.
STABLE_S = 5.0

Say = Callable[[str], None]


#: What a dying connection makes the calls on it raise: the connection's end, the daemon's
#: last error answer (``id: null``, or the answers a stop gave), the stream's errors.
_LOSS_KINDS = (DshClientError, RpcError, anyio.ClosedResourceError, anyio.BrokenResourceError,
               ConnectionError)


class Link:
    """The current connection to dshd and how to get a new one (module doc)."""

    def __init__(self, tasks: anyio.abc.TaskGroup, socket: str | os.PathLike[str] | None, *,
                 approvals: bool = False, timeout: float = DEFAULT_RECONNECT_TIMEOUT) -> None:
        if timeout < 0:
            raise ValueError("the reconnect timeout is >= 0 seconds")
        self._tasks = tasks
        self.socket = socket
        self.approvals = approvals
        self.timeout = timeout
        self._client: Client | None = None
        self._release = anyio.Event()
        self._outage_deadline: float | None = None
        self._back_at = -float("inf")
        #: How many times the link reconnected.
        self.reconnects = 0

    @property
    def client(self) -> Client:
        assert self._client is not None, "the link is not open"
        return self._client

    async def open(self) -> Client:
        """The first connection (``DaemonNotRunning`` etc. as ``connect`` raises them)."""
        self._client = await self._tasks.start(self._keep)
        return self._client

    async def _keep(self, *, task_status: Any) -> None:
        release = self._release = anyio.Event()
        async with connect(self.socket, approvals=self.approvals) as client:
            task_status.started(client)
            await release.wait()

    def lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` ended the caller's work because the connection to dshd was lost
        (and this link may reconnect)."""
        if self.timeout == 0 or self._client is None or not self._client.connection.closed:
            return False
        return all(isinstance(leaf, _LOSS_KINDS) for leaf in leaves(exc))

    def close(self) -> None:
        """Let the current connection go (its keeper closes it)."""
        self._release.set()
        self._client = None

    async def reconnect(self, say: Say, back: str = "dsh: reconnected to dshd") -> Client:
        """A new connection within the outage's budget (module doc), or ``DaemonGone``;
        ``back`` is the line said once dshd is back."""
        self.close()
        now = anyio.current_time()
        shared = self._outage_deadline is not None and now - self._back_at < STABLE_S
        if not shared:
            self._outage_deadline = now + self.timeout
        budget = self._outage_deadline - now
        say(f"dsh: lost dshd; reconnecting (up to {budget:.0f} s)…")
        wait, why = BACKOFF_INITIAL_S, "none"
        while True:
            left = self._outage_deadline - anyio.current_time()
            if left <= 0:
                raise DaemonGone(self.timeout, why, budget if shared else None, STABLE_S)
            with anyio.move_on_after(left):
                try:
                    self._client = await self._tasks.start(self._keep)
                except (DshClientError, RpcError, OSError) as exc:
                    why = str(exc.message if isinstance(exc, RpcError) else exc)
                else:
                    break
            if self._client is None:
                await anyio.sleep(min(wait, max(0.0, self._outage_deadline
                                                - anyio.current_time())))
                wait = min(wait * 2, BACKOFF_MAX_S)
        self._back_at = anyio.current_time()
        self.reconnects += 1
        say(back)
        return self._client


@asynccontextmanager
async def open_link(socket: str | os.PathLike[str] | None, *, approvals: bool = False,
                    timeout: float = DEFAULT_RECONNECT_TIMEOUT) -> AsyncIterator[Link]:
    """An open ``Link`` for the duration of the block; its connection closes after it."""
    async with anyio.create_task_group() as tasks:
        link = Link(tasks, socket, approvals=approvals, timeout=timeout)
        try:
            await link.open()
            yield link
        finally:
            link.close()


async def ride(link: Link, body: Callable[[Client], Awaitable[int]], say: Say) -> int:
    """Run ``body`` on the link's client; run it again on a new connection each time the old
    one was lost (module doc)."""
    while True:
        try:
            return await body(link.client)
        except BaseException as exc:  # noqa: BLE001 - re-raised unless the daemon went away
            if not link.lost(exc):
                raise
        await link.reconnect(say)
