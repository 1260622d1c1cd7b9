"""dsh's thin client: typed calls over the socket, live mirrors of streamed views, the CLI.

The library (``transport``, ``api``, ``subscription``) runs on anyio: under trio or asyncio,
whichever loop calls it. ``client.api.connect`` is the way in; ``follow`` and ``spill`` are
pure (no event loop), as is the mirror of a stream (``protocol.mirror``, shared with every
consumer and re-exported here); ``client.cli`` is the ``dsh`` command and
``client.exits`` every exit status it has. The client never imports the daemon (``dshd``).
"""

from client.api import Client, ConnectFailed, DaemonNotRunning, connect
from protocol.mirror import Mirror, MirrorBroken
from client.subscription import Subscription
from client.transport import ConnectionLost, DshClientError
from protocol.rpc import RpcError

__all__ = [
    "Client",
    "ConnectFailed",
    "ConnectionLost",
    "DaemonNotRunning",
    "DshClientError",
    "Mirror",
    "MirrorBroken",
    "RpcError",
    "Subscription",
    "connect",
]
