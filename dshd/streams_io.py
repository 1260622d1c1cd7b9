"""The byte stream under a connection: its fd for the fast send path, and how it is closed.

Theory of operation (PROTOCOL.md §1, the refusal rules of ``dshd.connection``): a refusal is
one error line, then :func:`half_close_and_drain` -- our side shuts its writing half and reads
what the peer sent (bounded in bytes, ``REFUSE_DRAIN_BYTES``, and in time, a share of the stop
budget) before closing, so the peer reads the line instead of a connection reset.
:func:`close_stream` closes shielded and bounded; :func:`refuse` is the whole refusal of a
connection that is not served. :func:`socket_fd` is the fd a ``Connection`` writes a line to
at once when nothing waits before it (``Connection._push``).
"""

from __future__ import annotations

import trio

from .daemon import StopBudget

__all__ = ["REFUSE_DRAIN_BYTES", "close_stream", "half_close_and_drain", "refuse", "socket_fd"]

#: What a refused peer may still send before the close, bytes (its unread input would
#: otherwise reset the connection before it reads its error line).
REFUSE_DRAIN_BYTES = 64 * 1024

_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError)


def socket_fd(stream: object) -> int | None:
    """The fd of a ``trio.SocketStream`` (the daemon's connections), else None (a memory
    stream in the daemon tests: every line goes through the writer)."""
    if isinstance(stream, trio.SocketStream):
        return stream.socket.fileno()
    return None


async def half_close_and_drain(stream: trio.abc.HalfCloseableStream, budget: StopBudget) -> None:
    """Shut our writing half, then read (bounded) what the peer still sends, so that closing
    does not reset a connection whose peer has not read our last line yet."""
    with trio.move_on_after(budget.refuse_drain):
        try:
            await stream.send_eof()
            drained = 0
            while drained < REFUSE_DRAIN_BYTES:
                data = await stream.receive_some(REFUSE_DRAIN_BYTES - drained)
                if not data:
                    return
                drained += len(data)
        except (*_CLOSED, trio.BusyResourceError, OSError):
            return  # gone, or the writer still sends to a peer that does not read: just close


async def close_stream(stream: trio.abc.AsyncResource, budget: StopBudget) -> None:
    """Close ``stream``, shielded (it runs when cancelled too) and bounded."""
    with trio.move_on_after(budget.close_stream) as cs:
        cs.shield = True
        await stream.aclose()


async def refuse(stream: trio.abc.HalfCloseableStream, line: bytes, budget: StopBudget) -> None:
    """Send one error line to a connection that is not served, drain (bounded), close."""
    try:
        with trio.move_on_after(budget.refuse_send):
            try:
                await stream.send_all(line)
            except _CLOSED:
                return
            await half_close_and_drain(stream, budget)
    finally:
        await close_stream(stream, budget)
