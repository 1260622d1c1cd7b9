"""What a handler is given: the connection it answers on, as a narrow port, and two helpers.

Theory of operation: a handler is ``async (conn, params) -> result``. ``conn`` is anything
with the attributes of :class:`ConnectionPort` (``dshd.connection.Connection`` is one; a test
may pass another), so this package never imports the connection module (no import cycle).
``conn.daemon`` is a :class:`DaemonPort`: the session registry and the sandbox a handler
reaches sessions and the probe through. :class:`AfterResponse` is the result of a handler
that must act once its answer is queued (``subscribe``: the base batch follows the response).
:func:`may_use` is the ownership rule of PROTOCOL.md §1 (system mode).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Protocol

__all__ = ["AfterResponse", "ConnectionPort", "DaemonPort", "may_use"]


class DaemonPort(Protocol):
    """What handlers use of the daemon (``dshd.daemon.Daemon``)."""

    config: Any  # dshd.config.Config (dispatch reads log_requests_slower_than_ms)
    registry: Any  # dshd.sessions.registry.SessionRegistry: get create list opened
    sandbox: Any  # the probe: describe()
    state_dir: Any

    def status(self) -> dict[str, Any]: ...

    def mint_subscription_id(self) -> str: ...


class ConnectionPort(Protocol):
    """What handlers use of a connection: its peer, its handshake state, its subscriptions
    and followers (``dshd.sessions.follow``: the connection is their ``FollowSink``)."""

    id: Any
    uid: int
    daemon: DaemonPort
    initialized: bool
    client: dict[str, Any]
    capabilities: dict[str, Any]
    subscriptions: dict[str, Any]
    followers: dict[str, Any]

    def mint_follow_id(self) -> str: ...

    def start_follower(self, run: Callable[[], Any]) -> None: ...

    async def reserve_follow(self, nbytes: int) -> None: ...

    def send_follow(self, line: bytes, reserved: int) -> None: ...

    def release_follow(self, reserved: int) -> None: ...


class AfterResponse:
    """A result whose ``then`` runs right after the response line is queued (for a request in
    a batch: after the batch's one array is queued)."""

    def __init__(self, result: object, then: Callable[[], None]) -> None:
        self.result = result
        self.then = then


def may_use(conn: ConnectionPort, owner: int | None) -> bool:
    """Root, the daemon's own user and the session's owner may use a session (system mode)."""
    return conn.uid in (0, os.geteuid()) or owner is None or owner == conn.uid
