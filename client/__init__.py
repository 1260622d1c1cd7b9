"""dsh's thin client: typed calls over the socket, live mirrors of streamed views, the CLI.

The library (``transport``, ``api``, ``subscription``) runs on anyio: under trio or asyncio,
whichever loop calls it. ``client.api.connect`` is the way in; ``follow`` and ``spill`` are
pure (no event loop), as is the mirror of a stream (``protocol.mirror``, shared with every
consumer and re-exported here); ``client.cli`` is the ``dsh`` command and
``client.exits`` every exit status it has. The client never imports the daemon (``dshd``).

The names below are resolved on first use (PEP 562 ``__getattr__``), so importing a
submodule -- the ``dsh`` command does, at every start -- does not load the library, anyio
and msgspec with it: ``dsh --version`` loads none of them. ``__version__`` is this client's
version; tests/client/test_client_cli_start.py holds it equal to the installed distribution's.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Exported name -> the module that defines it (imported when the name is first read).
_EXPORTS: dict[str, str] = {
    "Client": "client.api",
    "ConnectFailed": "client.api",
    "DaemonNotRunning": "client.api",
    "connect": "client.api",
    "ConnectionLost": "client.transport",
    "DshClientError": "client.transport",
    "Mirror": "protocol.mirror",
    "MirrorBroken": "protocol.mirror",
    "RpcError": "protocol.rpc",
    "Subscription": "client.subscription",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip this function
    return value
