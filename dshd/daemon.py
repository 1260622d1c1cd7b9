"""What every connection of one daemon shares, and the one stop budget (PROTOCOL.md §1, §3.6).

Theory of operation: :func:`dshd.server.serve` builds one :class:`Daemon` after it holds the
state directory's lock and has probed the sandbox, and hands it to every connection; nothing in
it is global. It holds the session registry, the connections being served (for ``daemon.status``
and the ``max_connections`` bound), the bounds all connections share (one :class:`LineBudget`
for the bytes of their unfinished lines, one limiter for the worker threads that parse long
lines) and the set of peer uids that may connect (the daemon's own user and root; in system
mode also the members of ``group``).

The stop budget: ``stop_timeout_seconds`` is the one config key every stop timeout of the
daemon derives from (:class:`StopBudget`): the sessions' wind-down deadline, the bound on
closing one stream, the bounds on refusing one connection. How it meets systemd's
``TimeoutStopSec=`` is ``dshd.service``'s business (``STOP_MARGIN_SECONDS``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from . import __version__
from .config import Config
from .sessions.registry import SessionRegistry

if TYPE_CHECKING:
    from .sessions.streams import Subscription

#: Worker threads that parse long lines at once, daemon-wide.
PARSE_THREADS = 2
@dataclass(frozen=True)
class StopBudget:
    """Every stop timeout of the daemon, as shares of ``stop_timeout_seconds`` (``total``).

    The shares keep the sum inside ``total``: at a graceful stop the sessions get
    :attr:`sessions`, then each connection's close is bounded by :attr:`close_stream`; a
    connection being refused at that moment is cancelled with the handlers and only its
    (shielded) close runs on.
    """

    total: float

    @classmethod
    def of(cls, config: Config) -> StopBudget:
        return cls(config.stop_timeout_seconds)

    @property
    def sessions(self) -> float:
        """The sessions' wind-down: cancel calls, settle them, flush (``registry.aclose``)."""
        return self.total * 0.8

    @property
    def answers(self) -> float:
        """From the start of a stop until the connections' answers in flight must be sent
        (after the sessions' share; ``Connection.finish``)."""
        return self.total * 0.9

    @property
    def close_stream(self) -> float:
        """Closing one connection's stream (shielded: it also runs when cancelled)."""
        return self.total * 0.1

    @property
    def refuse_send(self) -> float:
        """Sending a refused connection its one error line."""
        return self.total * 0.2

    @property
    def refuse_drain(self) -> float:
        """Reading what a refused peer still sends, so that it reads the line, not a reset."""
        return self.total * 0.1


class LineBudget:
    """Bytes of unfinished lines buffered by all connections together (``max_buffered_bytes``);
    a ``protocol.framing.Budget``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class Served(Protocol):
    """What the daemon reads of a connection it serves (``dshd.connection.Connection``)."""

    subscriptions: dict[str, Subscription]

    def finish(self) -> None:
        """Read no more; answer what is in flight, then close."""
        ...


def _group_members(group: str) -> set[int]:
    import grp
    import pwd

    try:
        g = grp.getgrnam(group)
    except KeyError:
        return set()
    uids = set()
    for name in g.gr_mem:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    for p in pwd.getpwall():
        if p.pw_gid == g.gr_gid:
            uids.add(p.pw_uid)
    return uids


class Daemon:
    """Everything the connection handlers share; built once, passed down."""

    def __init__(self, config: Config, state_dir: Path, sandbox, daemon_lock=None) -> None:
        self.config = config
        self.state_dir = state_dir
        self.sandbox = sandbox
        self.registry = SessionRegistry(config, state_dir, sandbox, daemon_lock)
        self.connections: set[Served] = set()
        self._connection_gone = trio.Event()
        self.refusing = 0  # connections being refused for max_connections (MAX_REFUSING)
        self.refusing_peers = 0  # peers being refused -32001; they hold a connection slot
        self.line_budget = LineBudget(config.max_buffered_bytes)
        self.parse_limiter = trio.CapacityLimiter(PARSE_THREADS)
        self.started_at = int(self.registry.started * 1000)  # one start time (ms), the registry's
        self.pid = os.getpid()
        self._allowed_uids = {os.getuid(), 0}
        if config.system:
            self._allowed_uids |= _group_members(config.group)
        self._next_sub = 0
        self._next_conn = 0

    @property
    def stop_budget(self) -> StopBudget:
        return StopBudget.of(self.config)  # read per use: stop_timeout_seconds reloads

    def peer_allowed(self, uid: int | None) -> bool:
        return uid is not None and uid in self._allowed_uids

    def slots_used(self) -> int:
        """Connections that hold a ``max_connections`` slot (served, or refused as a peer)."""
        return len(self.connections) + self.refusing_peers

    def mint_connection_id(self) -> int:
        self._next_conn += 1
        return self._next_conn

    def mint_subscription_id(self) -> str:
        self._next_sub += 1
        return f"sub-{self._next_sub}"

    def rebase(self, sub: Subscription) -> None:
        """Send ``sub`` a fresh base batch (its connection's queue drained after a drop)."""
        session = self.registry.opened(sub.session_id)
        if session is not None:
            session.rebase(sub)

    async def finish_connections(self, deadline: float) -> None:
        """A graceful stop's last part: every connection stops reading and sends its answers
        in flight; returns when all have closed or at ``deadline`` (trio time)."""
        for conn in list(self.connections):
            conn.finish()
        with trio.move_on_at(deadline):
            while self.connections:
                self._connection_gone = trio.Event()
                await self._connection_gone.wait()

    def forget(self, conn: Served) -> None:
        """``conn`` closed: end its subscriptions (the sessions' tool calls keep running)."""
        self.connections.discard(conn)
        self._connection_gone.set()
        for sub in list(conn.subscriptions.values()):
            sub.end()
            session = self.registry.opened(sub.session_id)
            if session is not None:
                session.unsubscribe(sub)
        conn.subscriptions.clear()

    def status(self) -> dict:
        return {
            "version": __version__,
            "pid": self.pid,
            "startedAt": self.started_at,
            "sessionsOpen": len(self.registry.open_sessions()),
            "connections": len(self.connections),
            "subscriptions": sum(len(c.subscriptions) for c in self.connections),
            # Stream batches dropped for slow readers (each later replaced by a base batch).
            "droppedBatches": sum(
                sub.dropped_batches for c in self.connections for sub in c.subscriptions.values()
            ),
            "sandbox": self.sandbox.describe(),
            "stateDir": str(self.state_dir),
        }
