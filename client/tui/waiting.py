"""The result of a command typed on the TUI's command line, waited for across dshd restarts.

Theory of operation: the call runs in its call host and outlives dshd (HOST.md §7), so a wait
cut by dshd going away is not the call's end. :func:`wait_result` asks ``tool.wait``; when
the connection is lost -- ``ConnectionLost``, or the answer a stopping dshd gives its waiters
first (``STORAGE_FAILURE``: "the session stopped before the result was recorded; ask again",
after which it closes the connection) -- it says once (``AWAY_TEXT``) that the command keeps
running and that its result shows when dshd is back, waits for the feed's next connection
(``DaemonFeed.next_client``) and asks ``tool.wait`` again there. A ``STORAGE_FAILURE`` on a
connection that stays open (a session that crashed and reopens from its log) is asked again
up to ``WAIT_RETRIES`` times, as ``dsh wait`` does; any other error answer is the caller's.
"""

from __future__ import annotations

from typing import Any, Callable

import anyio

from client.api import Client
from client.cli.stream import WAIT_RETRIES, WAIT_RETRY_S
from client.transport import DshClientError
from protocol.methods import ToolResult
from protocol.rpc import STORAGE_FAILURE, RpcError

__all__ = ["AWAY_TEXT", "wait_result"]

#: Said once when dshd goes away while a typed command's result is awaited.
AWAY_TEXT = "dshd went away; the command keeps running; its result shows when dshd is back"


async def wait_result(feed: Any, client: Client, session_id: str, call_id: str,
                      say: Callable[[str], None]) -> ToolResult:
    """The call's result, on whatever connection the feed has by then (module doc)."""
    told = False
    retries = 0
    while True:
        try:
            return await client.wait(session_id, call_id)
        except (RpcError, DshClientError) as exc:
            storage = isinstance(exc, RpcError) and exc.code == STORAGE_FAILURE
            if not client.connection.closed:
                if not storage or retries >= WAIT_RETRIES:
                    raise
                retries += 1
                await anyio.sleep(WAIT_RETRY_S)  # a stopping dshd closes the connection meanwhile
                if not client.connection.closed:
                    continue
        if not told:
            say(AWAY_TEXT)
            told = True
        client = await feed.next_client(client)
        retries = 0
