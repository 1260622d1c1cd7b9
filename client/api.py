"""Typed calls of the dshd client protocol (PROTOCOL.md §2–§3.6) over a ``Connection``, on
anyio (trio or asyncio, whichever runs the caller).

Theory of operation: ``connect`` resolves the socket path by the spec's rule
(``client.paths.socket_path``: ``--socket``, ``DSH_SOCKET``, defaults), opens the socket, runs a
``Connection`` for the duration of the block and sends ``initialize`` first -- within
``connect_timeout()`` seconds (``DSH_CONNECT_TIMEOUT``, else 10): a daemon alive but unable to
serve (out of file descriptors, the kernel queues the connection and nobody reads it) is
``DaemonUnresponsive``, not a hang; ``approvals=True`` makes the connection an approval
answerer for every session it subscribes to (§3.4). A missing or refusing socket is
``DaemonNotRunning``, whose message says how to start the daemon.

Every request -- ``initialize``, each method below, a ``Subscription``'s ``subscribe`` and
``unsubscribe`` -- goes through ``Client.request(method, params)``: the one place params are
encoded and results decoded (today plain JSON objects of the spec; the place where the shared
``protocol.methods`` structs plug in). The daemon's errors come out as
``protocol.rpc.RpcError`` with its ``code``, ``message`` and ``data``. This layer names the
calls, it does not model the domain.
"""

from __future__ import annotations

import math
import os
from contextlib import asynccontextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

import anyio
import msgspec

from client.paths import socket_path as resolve_socket_path
from client.subscription import Subscription
from client.transport import (
    DEFAULT_INBOX_BOUND,
    Connection,
    ConnectionLost,
    DshClientError,
    open_connection,
)

__all__ = ["Client", "connect", "DaemonNotRunning", "DaemonUnresponsive", "ConnectFailed",
           "CallLost", "PROTOCOL_VERSION", "dsh_version", "connect_timeout"]

PROTOCOL_VERSION = 1
#: How long ``connect`` waits for the socket and the ``initialize`` answer (seconds).
CONNECT_TIMEOUT_S = 10.0


class DaemonNotRunning(DshClientError):
    """Nothing listens on the socket (missing, or a stale socket file that refuses)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        super().__init__(
            f"dshd is not running at {self.path}; start it with `dshd` "
            "(or `systemctl --user start dshd`)"
        )


class DaemonUnresponsive(DshClientError):
    """The socket accepts but ``initialize`` got no answer in time (dshd overloaded, or out of
    file descriptors: the kernel queued the connection and the daemon never reads it)."""

    def __init__(self, path: str | os.PathLike[str], timeout: float) -> None:
        self.path = Path(path)
        super().__init__(
            f"dshd at {self.path} did not answer initialize within {timeout:g} s; it may be "
            "overloaded or out of file descriptors (see its log)"
        )


class CallLost(ConnectionLost):
    """The connection ended while a call was followed: ``hint`` says how to learn its fate."""

    def __init__(self, lost: BaseException, session_id: str, call_id: str) -> None:
        super().__init__(str(lost))
        self.hint = (f"after restarting dshd, `dsh wait {session_id} {call_id}` shows what "
                     "became of the call")


def connect_timeout() -> float:
    """``$DSH_CONNECT_TIMEOUT`` (seconds, > 0) when valid, else ``CONNECT_TIMEOUT_S``."""
    raw = os.environ.get("DSH_CONNECT_TIMEOUT", "")
    try:
        value = float(raw)
    except ValueError:
        return CONNECT_TIMEOUT_S
    return value if 0 < value < math.inf else CONNECT_TIMEOUT_S


class ConnectFailed(DshClientError):
    """The socket exists but could not be connected to for another reason (e.g. permissions)."""


def dsh_version() -> str:
    """This client's version (the installed ``dsh`` distribution, else "0")."""
    try:
        return metadata.version("dsh")
    except metadata.PackageNotFoundError:
        return "0"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class Client:
    """An initialized connection to dshd. Get one from ``connect``."""

    def __init__(self, conn: Connection, path: Path, server: dict[str, Any] | None = None) -> None:
        self._conn = conn
        self.socket_path = path
        #: The ``initialize`` result: protocolVersion, server {name, version}, sandbox.
        self.server: dict[str, Any] = server or {}

    @property
    def connection(self) -> Connection:
        return self._conn

    async def request(self, method: str, params: Mapping[str, Any] | msgspec.Struct | None = None,
                      *, on_result: Callable[[Any], None] | None = None) -> Any:
        """Send one request and return its decoded result (``RpcError`` for an error answer).

        The one path of every request this client sends (module doc): ``params`` is a mapping
        or a msgspec ``Struct`` (encoded by its own field names and renames, as the daemon
        decodes it). ``on_result`` runs in the reader as the answer arrives
        (``Connection.call``).
        """
        if isinstance(params, msgspec.Struct):
            wire: Any = msgspec.to_builtins(params)
        else:
            wire = dict(params or {})
        return await self._conn.call(method, wire, on_result=on_result)

    async def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """Any method, by name (for methods this class has no wrapper for)."""
        return await self.request(method, params)

    async def initialize(self, client_name: str, client_version: str | None,
                         approvals: bool) -> dict[str, Any]:
        """``initialize`` (PROTOCOL.md §2); keeps and returns the server's answer."""
        self.server = await self.request("initialize", {
            "protocolVersion": PROTOCOL_VERSION,
            "client": {"name": client_name, "version": client_version or dsh_version()},
            "capabilities": {"approvals": approvals},
        })
        return self.server

    # -- sessions ------------------------------------------------------------------------
    async def create_session(self, cwd: str | os.PathLike[str], title: str | None = None, *,
                             sandbox: str | None = None, approval_policy: str | None = None,
                             **opts: Any) -> str:
        """``session.create``. ``sandbox`` (``read-only`` | ``workspace-write`` |
        ``danger-full-access``) and ``approval_policy`` (``ask`` | ``never``) default to the
        daemon's config when None; ``opts`` are further params (``env``, ...; snake_case names
        are sent in camelCase). Returns the new session id."""
        params: dict[str, Any] = {"cwd": os.fspath(cwd)}
        if title is not None:
            params["title"] = title
        opts = {"sandbox": sandbox, "approval_policy": approval_policy, **opts}
        for key, value in opts.items():
            if value is not None:
                params[_camel(key)] = value
        result = await self.request("session.create", params)
        return result["sessionId"]

    async def list_sessions(self) -> list[dict[str, Any]]:
        result = await self.request("session.list", {})
        return result["sessions"]

    async def get_session(self, session_id: str) -> dict[str, Any]:
        return await self.request("session.get", {"sessionId": session_id})

    async def events(self, session_id: str, after_seq: int = -1, limit: int = 1000) -> dict[str, Any]:
        """One page of ``session.events``: ``{"events": [...], "lastSeq": n}``."""
        return await self.request(
            "session.events", {"sessionId": session_id, "afterSeq": after_seq, "limit": limit}
        )

    async def iter_events(self, session_id: str, after_seq: int = -1,
                          page_size: int = 1000) -> AsyncIterator[dict[str, Any]]:
        """Every event after ``after_seq``, oldest first, page by page, up to the ``lastSeq``
        the daemon reported when the walk reached it."""
        while True:
            page = await self.events(session_id, after_seq, page_size)
            events = page["events"]
            for event in events:
                yield event
            if not events or events[-1]["seq"] >= page["lastSeq"]:
                return
            after_seq = events[-1]["seq"]

    # -- tools ---------------------------------------------------------------------------
    async def run_tool(self, session_id: str, command: str, *, call_id: str | None = None,
                       timeout: float | None = None, approved: bool = True,
                       name: str = "bash") -> str:
        """``tool.run`` of the bash tool; returns the callId (the existing one when
        ``call_id`` names a call already in the session)."""
        result = await self.start_tool(session_id, command, call_id=call_id, timeout=timeout,
                                       approved=approved, name=name)
        return result["callId"]

    async def start_tool(self, session_id: str, command: str, *, call_id: str | None = None,
                         timeout: float | None = None, approved: bool = True,
                         name: str = "bash") -> dict[str, Any]:
        """``tool.run`` of the bash tool; returns its result: ``{"callId"}``, with
        ``"existing": true`` when ``call_id`` names a call already in the session (nothing
        was run again)."""
        arguments: dict[str, Any] = {"command": command}
        if timeout is not None:
            arguments["timeout"] = timeout
        params: dict[str, Any] = {
            "sessionId": session_id,
            "name": name,
            "arguments": arguments,
            "approved": approved,
        }
        if call_id is not None:
            params["callId"] = call_id
        return await self.request("tool.run", params)

    async def wait(self, session_id: str, call_id: str, timeout: float | None = None) -> dict[str, Any]:
        """``tool.wait``: the ToolResult once durable. With ``timeout`` the daemon answers
        ``-32010`` when it passes (and the call keeps running)."""
        params: dict[str, Any] = {"sessionId": session_id, "callId": call_id}
        if timeout is not None:
            params["timeout"] = timeout
        return await self.request("tool.wait", params)

    async def cancel(self, session_id: str, call_id: str) -> bool:
        result = await self.request("tool.cancel", {"sessionId": session_id, "callId": call_id})
        return bool(result["cancelled"])

    # -- approvals (PROTOCOL.md §3.4) -------------------------------------------------------
    async def decide(self, session_id: str, approval_id: str, decision: str) -> str:
        """``approval.decide`` (``decision``: ``allow`` | ``reject``); returns the outcome
        (``allowed-once`` | ``rejected``). A request decided already is ``RpcError`` -32011 with
        ``data["outcome"]``; an unknown one -32007."""
        result = await self.request(
            "approval.decide",
            {"sessionId": session_id, "approvalId": approval_id, "decision": decision},
        )
        return result["outcome"]

    async def set_policy(self, session_id: str, policy: str) -> None:
        """``session.setApprovalPolicy`` (``ask`` | ``never``)."""
        await self.request("session.setApprovalPolicy", {"sessionId": session_id, "policy": policy})

    # -- streams and daemon --------------------------------------------------------------
    async def subscribe(self, session_id: str, *, bound: int = DEFAULT_INBOX_BOUND) -> Subscription:
        """Subscribe to the session's lane view; iterate the returned ``Subscription``."""
        sub = Subscription(self._conn, session_id, bound=bound, request=self.request)
        await sub.open()
        return sub

    async def status(self) -> dict[str, Any]:
        return await self.request("daemon.status", {})


@asynccontextmanager
async def connect(
    socket_path: str | os.PathLike[str] | None = None,
    client_name: str = "dsh",
    *,
    approvals: bool = False,
    client_version: str | None = None,
) -> AsyncIterator[Client]:
    """Connect to dshd and ``initialize``; the connection closes when the block ends."""
    path = resolve_socket_path(socket_path)
    timeout = connect_timeout()
    deadline = anyio.current_time() + timeout
    try:
        with anyio.fail_after(timeout):
            stream = await anyio.connect_unix(os.fspath(path))
    except TimeoutError:
        raise DaemonUnresponsive(path, timeout) from None
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
        raise DaemonNotRunning(path) from exc
    except OSError as exc:
        raise ConnectFailed(f"cannot connect to dshd at {path}: {exc.strerror or exc}") from exc
    async with open_connection(stream) as conn:
        client = Client(conn, path)
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                await client.initialize(client_name, client_version, approvals)
        except TimeoutError:
            raise DaemonUnresponsive(path, timeout) from None
        yield client
