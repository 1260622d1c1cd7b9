"""dsh's thin client: typed calls over the socket, live mirrors of streamed views, the CLI.

``client.api.connect`` is the way in; ``client.mirror`` is pure (no I/O); ``client.cli`` is the
``dsh`` command.
"""

from client.api import Client, ConnectFailed, DaemonNotRunning, connect
from client.mirror import Mirror, MirrorBroken
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
