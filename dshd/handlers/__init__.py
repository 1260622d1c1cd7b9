"""JSON-RPC method handlers (PROTOCOL.md §2–§3.6): one handler per method, and dispatch.

Theory of operation: each method of ``protocol.methods.METHODS`` has one handler here, an
``async (conn, params) -> result`` that takes the method's params struct, returns its result
struct and refuses by raising a ``dshd.errors`` class; :func:`dispatch` (``dispatch.py``) runs
them and is the one place an exception becomes an error response (``to_rpc_error``). The
modules split along the protocol's sections: ``lifecycle`` (§2, §3.6), ``sessions`` (§3.1),
``calls`` (§3.2, §3.4), ``raw`` (§3.2's raw channel: a call's bytes and input, HOST.md §6),
``streams`` (§3.3), ``turns`` (§3.5); ``port`` is where the session
room's own exceptions become ``dshd.errors`` classes, ``context`` what a handler is given.

What a request may record is checked before anything is recorded: by the params structs (JSON
values, ids, caps: ``protocol.methods``), by the tool registry's one argument check
(``dshd.tools``), then by the handler (paths, the session, the limits); past any of them the
answer is an error and the session is untouched.
"""

from .context import AfterResponse, ConnectionPort, DaemonPort, may_use
from .dispatch import HANDLERS, NOT_A_CALL, Answer, dispatch

__all__ = [
    "HANDLERS", "NOT_A_CALL", "AfterResponse", "Answer", "ConnectionPort", "DaemonPort",
    "dispatch", "may_use",
]
