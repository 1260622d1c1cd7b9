"""``initialize`` and ``daemon.status`` (PROTOCOL.md §2, §3.6): the handshake and the daemon.

Theory of operation: ``initialize`` is the one method allowed before the handshake (the
dispatcher refuses the others with ``-32002``); it records what the client said about itself
on the connection and answers what this daemon is: its version, its sandbox, its tools (the
tool registry, ``dshd.tools``), every method it answers (``protocol.methods.METHODS``) and its
capabilities, so a client can degrade on an older daemon.
"""

from __future__ import annotations

import msgspec

from protocol import methods as m

from .. import __version__
from ..errors import InvalidRequest, UnsupportedVersion
from ..tools import tool_names
from .context import ConnectionPort

__all__ = ["daemon_status", "initialize"]


async def initialize(conn: ConnectionPort, p: m.InitializeParams) -> m.InitializeResult:
    if conn.initialized:
        raise InvalidRequest("initialize was already called on this connection")
    if p.protocol_version != m.PROTOCOL_VERSION:
        raise UnsupportedVersion(
            f"protocol version {p.protocol_version} is not supported; this dshd speaks "
            f"{m.PROTOCOL_VERSION}",
            {"supported": [m.PROTOCOL_VERSION]},
        )
    conn.initialized = True
    conn.client = msgspec.to_builtins(p.client) if p.client is not None else {}
    conn.capabilities = msgspec.to_builtins(p.capabilities) if p.capabilities is not None else {}
    sandbox = conn.daemon.sandbox.describe()
    return m.InitializeResult(
        protocol_version=m.PROTOCOL_VERSION,
        server=m.ServerInfo(name="dshd", version=__version__),
        sandbox=m.SandboxInfo(provider=sandbox["provider"], completeness=sandbox["completeness"]),
        tools=tool_names(),
        methods=sorted(m.METHODS),
        capabilities=m.DaemonCapabilities(),
    )


async def daemon_status(conn: ConnectionPort, p: m.EmptyParams) -> m.DaemonStatus:
    return msgspec.convert(conn.daemon.status(), m.DaemonStatus)
