"""The raw channel (PROTOCOL.md §3.2, HOST.md §6): a call's bytes and its input.

Theory of operation: a call's output is its call dir's log, written by the call host; these
handlers read it through ``dshd.sessions.follow`` (``tool.read``: one read; ``tool.follow``: a
:class:`~dshd.sessions.follow.Follower` task of the connection, started once its answer is
queued, so ``{"followId"}`` precedes the first ``output``). Input goes to the running call's
host through its ``HostHandle`` (``dshd.execution.hosted``): ``tool.write`` (answered once the
command's stdin took every byte), ``tool.closeStdin``, ``tool.resize``, ``tool.signal``.

Authorisation is ``tool.cancel``'s: any connection of the session's user (``port.open_session``).
Input to a call whose command has not started yet (its approval gate, its checkpoint, its
host starting) waits until it runs, so ``tool.run`` then ``tool.write`` needs no retry loop.
Refusals: an unknown call is ``-32006`` (``CallNotFound``); input to a settled call ``-32006``
with ``data.code`` ``CALL_SETTLED`` (also one that settles without ever running); a write or closeStdin to a pipe call started
without ``stdin: "pipe"`` ``-32602`` ``NO_STDIN``; a resize of a call without a terminal
``-32602`` ``NO_TTY``; a call whose output retention removed (``max_state_bytes``)
``-32602`` ``OUTPUT_REMOVED`` with a sentence saying when; a read offset outside ``[firstOffset, endOffset]`` ``-32602`` naming the
bound in ``data`` (a follower before ``firstOffset`` gets a ``gap`` instead). At most
:data:`MAX_FOLLOWERS_PER_CONNECTION` followers per connection (``-32013``). Struct caps
(offsets ≥ 0, limit ≤ 4 MiB, data ≤ 1 MiB, 1..10,000 cells, signal names) are
``protocol.methods``'.
"""

from __future__ import annotations

from typing import Any

import trio

from protocol import methods as m

from ..errors import CallNotFound, CallSettled, InvalidParams, LimitExceeded
from ..execution.hostlink import HostRequestError
from ..sessions.follow import CallSource, Follower, Gap
from ..sessions.retention import check_output
from . import port
from .context import AfterResponse, ConnectionPort
from .streams import MAX_SUBSCRIPTIONS_PER_CONNECTION

__all__ = [
    "MAX_FOLLOWERS_PER_CONNECTION", "tool_close_stdin", "tool_follow", "tool_read",
    "tool_resize", "tool_signal", "tool_unfollow", "tool_write",
]

#: Followers one connection may hold at once (the subscriptions' bound; PROTOCOL.md §5).
MAX_FOLLOWERS_PER_CONNECTION = MAX_SUBSCRIPTIONS_PER_CONNECTION

#: Seconds between two looks at a call whose command has not started, for input to it.
START_POLL_SECONDS = 0.05

NO_STDIN = ('the call was started without stdin: pass stdin: "pipe" or tty: true in the '
            'bash arguments to write to it')


async def _source(conn: ConnectionPort, session_id: str, call_id: str) -> tuple[Any, CallSource]:
    session = await port.open_session(conn, session_id)
    if not session.has_call(call_id):
        raise CallNotFound(f"call {call_id} not found in session {session_id}")
    registry = conn.daemon.registry
    output = session.call_output(call_id)
    if output.result is not None:  # only a settled call's output is ever removed
        await check_output(output.dir, session_id, call_id)

    def lookup() -> Any:  # the session now: a follower outlives an evicted or revived one
        return (registry.opened(session_id) or session).call_output(call_id)

    return session, CallSource(call_id, lookup)


def _bounds(state: Any, offset: int) -> None:
    if offset < state.first_offset:
        raise InvalidParams(
            f"offset {offset} is before the call's first retained byte {state.first_offset}: "
            "the per-call disk cap (spill_max_bytes) dropped the bytes before it; read from "
            "firstOffset", field="offset", firstOffset=state.first_offset)
    if offset > state.end_offset:
        raise InvalidParams(
            f"offset {offset} is past the call's output, which ends at {state.end_offset} "
            "bytes now", field="offset", endOffset=state.end_offset)


async def tool_read(conn: ConnectionPort, p: m.ToolReadParams) -> m.ToolReadResult:
    _, source = await _source(conn, p.session_id, p.call_id)
    state = await source.state()
    _bounds(state, p.offset)
    try:
        data = await source.read(state, p.offset, p.limit)
    except Gap as gap:  # the host dropped a segment since the scan
        raise InvalidParams(
            f"offset {p.offset} is before the call's first retained byte {gap.first_offset} "
            "(dropped meanwhile by the per-call disk cap); read from firstOffset",
            field="offset", firstOffset=gap.first_offset) from None
    end = p.offset + len(data)
    return m.ToolReadResult(offset=p.offset, data=data, first_offset=state.first_offset,
                            end_offset=state.end_offset,
                            eof=state.ended and end == state.end_offset)


def _check_followers(conn: ConnectionPort) -> None:
    if len(conn.followers) >= MAX_FOLLOWERS_PER_CONNECTION:
        raise LimitExceeded(
            f"limit exceeded: this connection already holds {len(conn.followers)} followers "
            f"(at most {MAX_FOLLOWERS_PER_CONNECTION}); tool.unfollow one first, or use "
            "another connection")


async def tool_follow(conn: ConnectionPort, p: m.ToolFollowParams) -> AfterResponse:
    _check_followers(conn)
    _, source = await _source(conn, p.session_id, p.call_id)
    state = await source.state()
    if p.offset > state.end_offset:
        _bounds(state, p.offset)
    # Again with no await before the follower is registered: pipelined follows of one
    # connection all passed the first check while the others awaited (496 of 256 got in).
    _check_followers(conn)
    follow_id = conn.mint_follow_id()
    follower = Follower(follow_id, source, p.offset, conn,
                        on_end=lambda f: conn.followers.pop(f.id, None))
    conn.followers[follow_id] = follower
    return AfterResponse(m.ToolFollowResult(follow_id=follow_id),
                         lambda: conn.start_follower(follower.run))


async def tool_unfollow(conn: ConnectionPort, p: m.ToolUnfollowParams) -> m.EmptyResult:
    follower = conn.followers.pop(p.follow_id, None)
    if follower is None:
        raise InvalidParams(f"no follower {p.follow_id!r} on this connection (it ended, or "
                            "another connection made it)", field="followId")
    follower.cancel()
    return m.EmptyResult()


# ---------------------------------------------------------------------- input
async def _running_host(conn: ConnectionPort, session_id: str, call_id: str) -> Any:
    """The host handle of a running call whose command started (module doc's refusals)."""
    _, source = await _source(conn, session_id, call_id)
    while True:
        out = source.output()
        if out.result is not None or (out.host is not None and out.host.record is not None):
            raise CallSettled(session_id, call_id)
        if out.host is not None:
            return out.host
        await trio.sleep(START_POLL_SECONDS)  # its approval, its checkpoint, its host's start


async def _ask(session_id: str, call_id: str, request: Any) -> Any:
    """Run one host request; the host's refusals as this protocol's errors."""
    try:
        return await request
    except HostRequestError as exc:
        code = exc.code
        if code == "not-running":
            raise CallSettled(session_id, call_id) from None
        if code == "no-stdin":  # the call had stdin (checked before asking): it was closed
            raise InvalidParams(_stdin_closed(exc.sentence), field="callId",
                                code="NO_STDIN") from None
        raise InvalidParams(f"the call's host refused the request: {exc}",
                            field="callId") from None


def _stdin_closed(sentence: str) -> str:
    """NO_STDIN's message for a call whose stdin was closed: the host's reason in brackets,
    unless it only says the same ("the call's stdin is closed (the call's stdin is closed)")."""
    if "stdin is closed" in sentence:
        return "the call's stdin is closed; it takes no more input"
    return f"the call's stdin is closed ({sentence}); it takes no more input"


async def tool_write(conn: ConnectionPort, p: m.ToolWriteParams) -> m.ToolWriteResult:
    host = await _running_host(conn, p.session_id, p.call_id)
    if not host.tty and not host.stdin_pipe:
        raise InvalidParams(NO_STDIN, field="callId", code="NO_STDIN")
    written = await _ask(p.session_id, p.call_id, host.write(p.data))
    return m.ToolWriteResult(written=written)


async def tool_close_stdin(conn: ConnectionPort, p: m.ToolCallParams) -> m.EmptyResult:
    host = await _running_host(conn, p.session_id, p.call_id)
    if not host.tty and not host.stdin_pipe:
        raise InvalidParams(NO_STDIN, field="callId", code="NO_STDIN")
    await _ask(p.session_id, p.call_id, host.close_stdin())
    return m.EmptyResult()


async def tool_resize(conn: ConnectionPort, p: m.ToolResizeParams) -> m.EmptyResult:
    host = await _running_host(conn, p.session_id, p.call_id)
    if not host.tty:
        raise InvalidParams(f"call {p.call_id} has no terminal: only a call started with "
                            "tty: true can be resized", field="callId", code="NO_TTY")
    await _ask(p.session_id, p.call_id, host.resize(p.cols, p.rows))
    return m.EmptyResult()


async def tool_signal(conn: ConnectionPort, p: m.ToolSignalParams) -> m.EmptyResult:
    host = await _running_host(conn, p.session_id, p.call_id)
    await _ask(p.session_id, p.call_id, host.signal(p.signal))
    return m.EmptyResult()
