"""The connection's send path over a real Unix socket: the fast path (a line written to the
socket at once when nothing is queued) and the writer's queue behind it keep every byte and
the order lines were queued in, whatever the socket buffer takes; budgets come back to zero.

A real ``dshd.connection.Connection`` on a real ``socket.socketpair`` (small buffers, so that
a large line is cut by the kernel and its rest waits in the queue), a peer that does not read
until everything is queued, and real time (no clock: the kernel decides what fits).
"""

from __future__ import annotations

import os
import socket

import trio

from dshd.config import Config
from dshd.connection import Connection
from dshd.daemon import LineBudget, StopBudget

LIVENESS = 10.0


class StubDaemon:
    """What a Connection uses of its daemon, for a connection that never dispatches."""

    def __init__(self, tmp_path) -> None:
        self.config = Config(socket=str(tmp_path / "s"), state_dir=str(tmp_path / "state"))
        self.line_budget = LineBudget(self.config.max_buffered_bytes)
        self.stop_budget = StopBudget.of(self.config)
        self.parse_limiter = trio.CapacityLimiter(1)

    def mint_connection_id(self) -> int:
        return 1

    def rebase(self, sub) -> None:  # pragma: no cover - no subscriptions here
        raise AssertionError("no subscription in this test")


async def never_dispatched(peer, item):  # pragma: no cover - the peer sends nothing
    raise AssertionError("nothing is dispatched in this test")


def small_socketpair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (ours, theirs):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return ours, theirs


async def test_lines_keep_their_bytes_and_order_through_fast_path_and_queue(tmp_path):
    ours, theirs = small_socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    conn = Connection(StubDaemon(tmp_path), stream, os.getuid(), never_dispatched)
    # Small lines (the fast path takes them while the buffer has room), lines far larger than
    # the socket buffer (cut: the rest is queued), and small ones behind those (must queue).
    sizes = [40, 50, 300_000, 60, 70, 1, 200_000, 30] + [100] * 200
    lines = [bytes([65 + i % 26]) * (n - 1) + b"\n" for i, n in enumerate(sizes)]
    expected = b"".join(lines)
    got = bytearray()

    def read_all() -> None:
        theirs.settimeout(LIVENESS)
        while len(got) < len(expected):
            chunk = theirs.recv(65536)
            if not chunk:
                return
            got.extend(chunk)

    with trio.fail_after(LIVENESS):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await trio.sleep(0)  # the writer is waiting
            conn.send_line(lines[0])
            # The fast path: out at once, nothing queued, nothing waiting for the writer.
            assert conn._response_bytes == 0 and not conn._queue
            for line in lines[1:]:
                conn.send_line(line)
                assert conn._response_bytes <= sum(sizes)
            assert conn._queue, "the socket buffer cannot hold it all: some lines must queue"
            await trio.to_thread.run_sync(read_all)
            while conn._response_bytes:
                await trio.sleep(0.01)
            theirs.shutdown(socket.SHUT_WR)  # end of input: the connection ends
    theirs.close()
    assert bytes(got) == expected
    assert conn._response_bytes == 0 and not conn._queue


async def test_nothing_is_written_after_the_connection_ended(tmp_path):
    ours, theirs = small_socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    conn = Connection(StubDaemon(tmp_path), stream, os.getuid(), never_dispatched)
    theirs.shutdown(socket.SHUT_WR)
    with trio.fail_after(LIVENESS):
        await conn.run()
    # The fd number may already belong to another file: a late line must not reach it.
    spare = os.open(os.devnull, os.O_WRONLY)
    try:
        conn.send_line(b'{"late":true}\n')
        assert os.fstat(spare)  # still ours, untouched
    finally:
        os.close(spare)
        theirs.close()
    assert conn._fd is None
