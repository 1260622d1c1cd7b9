"""The wire shell over a memory stream (issue 11, room C): ``dshd.server.serve_stream`` and
``dshd.connection.Connection`` need no socket: the uid is passed in and the peer-gone check is
optional. JSON lines in, JSON lines out, on the autojump clock (no real sleeps)."""

from __future__ import annotations

import json
import os

import pytest
import trio
import trio.testing

from dshd.config import Config
from dshd.daemon import Daemon, StopBudget
from dshd.execution.sandbox import probe
from dshd.server import serve_stream
from dshd.service import STOP_MARGIN_SECONDS, stopping_message, unit_timeout_stop_sec
from protocol import rpc

INIT = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'


@pytest.fixture
async def daemon(tmp_path):
    config = Config(state_dir=str(tmp_path / "state"), socket=str(tmp_path / "sock"),
                    sandbox_provider="none", max_message_bytes=4096,
                    max_buffered_bytes=1 << 20)
    sandbox = await probe("none", scratch_dir=tmp_path / "scratch")
    d = Daemon(config, tmp_path / "state", sandbox)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.registry.run)
        yield d
        nursery.cancel_scope.cancel()


class Peer:
    """The client end: send lines, read answers line by line."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.buf = b""

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def line(self):
        while b"\n" not in self.buf:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


async def _serve(nursery, daemon, uid=None):
    client, server = trio.testing.memory_stream_pair()
    nursery.start_soon(serve_stream, daemon, server, os.getuid() if uid is None else uid)
    return Peer(client)


async def test_a_connection_over_a_memory_stream_answers_and_finishes_after_half_close(daemon,
                                                                                       autojump_clock):
    async with trio.open_nursery() as nursery:
        peer = await _serve(nursery, daemon)
        await peer.send(INIT)
        assert (await peer.line())["result"]["protocolVersion"] == 1
        # In flight at end of input: answered after the half-close (no socket to poll).
        await peer.send(b'{"jsonrpc":"2.0","id":2,"method":"daemon.status"}\n')
        await peer.stream.send_eof()
        status = await peer.line()
        assert status["id"] == 2 and status["result"]["connections"] == 1
        assert await peer.line() is None  # then the daemon closes
    assert daemon.connections == set() and daemon.line_budget.used == 0


async def test_an_oversize_line_is_answered_and_the_connection_goes_on(daemon, autojump_clock):
    async with trio.open_nursery() as nursery:
        peer = await _serve(nursery, daemon)
        await peer.send(INIT)
        await peer.line()
        await peer.send(b'{"x":"' + b"y" * 3000)
        await peer.send(b"z" * 3000 + b'"}\n{"jsonrpc":"2.0","id":3,"method":"daemon.status"}\n')
        error = await peer.line()
        assert error["id"] is None and error["error"]["code"] == rpc.INVALID_REQUEST
        assert "max_message_bytes (4096 bytes)" in error["error"]["message"]
        assert (await peer.line())["id"] == 3
        assert daemon.line_budget.used == 0
        nursery.cancel_scope.cancel()


async def test_the_initialize_deadline_refuses_a_trickling_peer(daemon, autojump_clock):
    async with trio.open_nursery() as nursery:
        peer = await _serve(nursery, daemon)
        start = trio.current_time()
        for _ in range(30):  # a byte now and then, never a whole line
            await peer.send(b" ")
            await trio.sleep(1)
            if daemon.connections == set():
                break
        refused = await peer.line()
        assert refused["error"]["code"] == rpc.NOT_INITIALIZED and refused["id"] is None
        assert await peer.line() is None
        took = trio.current_time() - start
        assert daemon.config.initialize_timeout_seconds <= took < 30


async def test_a_foreign_uid_gets_one_line_and_a_close(daemon, autojump_clock):
    async with trio.open_nursery() as nursery:
        peer = await _serve(nursery, daemon, uid=os.getuid() + 12345)
        refused = await peer.line()
        assert refused["error"]["code"] == rpc.PERMISSION_DENIED and refused["id"] is None
        assert await peer.line() is None
    assert daemon.slots_used() == 0


async def test_past_max_connections_the_next_one_gets_one_line_and_a_close(daemon, autojump_clock):
    daemon.config.max_connections = 1
    async with trio.open_nursery() as nursery:
        first = await _serve(nursery, daemon)
        await first.send(INIT)
        await first.line()
        second = await _serve(nursery, daemon)
        refused = await second.line()
        assert refused["error"]["code"] == rpc.LIMIT_EXCEEDED
        assert "at most 1 connections" in refused["error"]["message"]
        assert await second.line() is None
        nursery.cancel_scope.cancel()


async def test_a_refused_peer_that_never_reads_is_closed_within_the_stop_budget(daemon,
                                                                                autojump_clock):
    """The refusal bounds are shares of stop_timeout_seconds: a peer that neither reads nor
    closes is let go after refuse_send + close_stream at most."""
    daemon.config.stop_timeout_seconds = 2.0
    budget = daemon.stop_budget
    _client, server = trio.testing.memory_stream_pair()
    start = trio.current_time()
    with trio.fail_after(budget.refuse_send + budget.close_stream + 0.01):
        await serve_stream(daemon, server, os.getuid() + 1)
    assert trio.current_time() - start <= budget.refuse_send + budget.close_stream


def test_every_stop_share_fits_in_the_one_budget_and_the_unit_is_rendered_from_it():
    config = Config()
    budget = StopBudget.of(config)
    assert budget.total == config.stop_timeout_seconds == 10.0
    # At a stop: the sessions' share, then one shielded close per connection (in parallel).
    assert budget.sessions + budget.close_stream <= budget.total
    assert budget.refuse_send + budget.close_stream <= budget.total
    assert unit_timeout_stop_sec(config) == 15 == budget.total + STOP_MARGIN_SECONDS
    raised = Config(stop_timeout_seconds=100)
    assert unit_timeout_stop_sec(raised) == 105
    assert stopping_message(StopBudget.of(raised)).splitlines() == [
        "STOPPING=1", "EXTEND_TIMEOUT_USEC=105000000"]
