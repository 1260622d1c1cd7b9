"""Tool calls (PROTOCOL.md §3.2): tool.run, tool.wait, tool.cancel (approvals: ``approvals``).

Theory of operation: ``tool.run`` checks everything before it records anything: the params
struct (ids, JSON values, the 8 MiB cap), the session, then the tool and its arguments through
the tool registry's one check (``dshd.tools.check_arguments``, the check a model's call gets
too); a known ``callId`` answers ``existing`` without running again when the request is the
same call (its tool and arguments' digest, ``dshd.sessions.call_index``), else ``-32602``
``CALL_ID_REUSED`` (a call whose digest is not known is taken as the same); past the call limits the
answer is ``-32013`` and nothing is recorded. ``tool.wait`` answers the durable ToolResult, or
``-32010`` when the wait times out (the call goes on); the recorded result goes out as the
``protocol.lane.ToolResult`` struct a client decodes it into (the same bytes: the session
records that struct's plain value, a crash repair the same shape). A call id the session does
not know is ``-32006`` (``dshd.errors.CallNotFound``).
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec

from protocol import methods as m

from ..errors import CallNotFound, StillRunning
from ..tools import check_arguments
from . import port
from .context import ConnectionPort

__all__ = ["tool_cancel", "tool_run", "tool_wait"]


async def tool_run(conn: ConnectionPort, p: m.ToolRunParams) -> m.ToolRunResult:
    session = await port.open_session(conn, p.session_id)
    check_arguments(p.name, p.arguments, values_checked=True)
    call_id = p.call_id or ("c-" + secrets.token_hex(6))
    if session.has_call(call_id, p.name, p.arguments):  # CALL_ID_REUSED with other arguments
        return m.ToolRunResult(call_id=call_id, existing=True)
    port.start_call(session, call_id, p.name, p.arguments, p.approved, p.ask_timeout or 0.0)
    return m.ToolRunResult(call_id=call_id)


def _known_call(session: Any, session_id: str, call_id: str) -> None:
    if not session.has_call(call_id):
        raise CallNotFound(f"call {call_id} not found in session {session_id}")


async def tool_wait(conn: ConnectionPort, p: m.ToolWaitParams) -> m.ToolResult:
    session = await port.open_session(conn, p.session_id)
    _known_call(session, p.session_id, p.call_id)
    result = await session.wait_result(p.call_id, p.timeout)
    if result is None:
        raise StillRunning(f"call {p.call_id} is still running after {p.timeout} s; wait again")
    return msgspec.convert(result, m.ToolResult)


async def tool_cancel(conn: ConnectionPort, p: m.ToolCancelParams) -> m.CancelledResult:
    session = await port.open_session(conn, p.session_id)
    _known_call(session, p.session_id, p.call_id)
    return m.CancelledResult(cancelled=session.cancel_call(p.call_id))

