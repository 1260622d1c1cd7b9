"""Connections that never finish ``initialize`` cannot hold the daemon's slots, and a lone
UTF-16 surrogate escape is named as such — against a real dshd over raw sockets."""

from __future__ import annotations

import json
import threading
import time

import pytest

from .conftest import running_daemon
from .test_e2e_hardening_wire import RawClient


@pytest.fixture
def init_daemon():
    with running_daemon("max_connections = 4\ninitialize_timeout_seconds = 2\n",
                        prefix="dsh-init-") as d:
        yield d


def test_uninitialized_connections_are_closed_after_the_deadline(init_daemon):
    d = init_daemon
    time.sleep(0.2)  # the start probe's connection has gone
    stop = threading.Event()
    squatters = [RawClient(d.socket, timeout=30) for _ in range(4)]

    def trickle() -> None:  # one byte now and then, never a whole line
        while not stop.is_set():
            for s in squatters:
                try:
                    s.sock.sendall(b" ")
                except OSError:
                    pass
            stop.wait(0.5)

    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    try:
        time.sleep(0.3)
        refused = RawClient(d.socket)  # all slots held: refused now
        assert json.loads(refused.line())["error"]["code"] == -32013
        for s in squatters:  # each gets one error line naming the deadline, then EOF
            err = json.loads(s.line())
            assert err["id"] is None and err["error"]["code"] == -32002, err
            assert "initialize" in err["error"]["message"], err
            assert "initialize_timeout_seconds" in err["error"]["message"], err
            assert s.line() is None
        deadline = time.monotonic() + 10
        while True:  # a new client gets in (liveness bound)
            c = RawClient(d.socket)
            c.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": 1}})
            first = json.loads(c.line())
            if "result" in first:
                break
            assert time.monotonic() < deadline, first
            time.sleep(0.2)
        c.send({"jsonrpc": "2.0", "id": 2, "method": "daemon.status"})
        assert "result" in json.loads(c.line())
    finally:
        stop.set()
        feeder.join(5)


def test_an_initialized_connection_is_not_closed_by_the_deadline(init_daemon):
    d = init_daemon
    c = RawClient(d.socket).init()
    time.sleep(3)  # past initialize_timeout_seconds
    c.send({"jsonrpc": "2.0", "id": 7, "method": "daemon.status"})
    assert "result" in json.loads(c.line())


def test_a_lone_surrogate_escape_is_named(daemon, workdir):
    c = RawClient(daemon.socket).init()
    for title in ("\\ud800", "a\\udc00b", "\\ud800\\u0041"):
        line = ('{"jsonrpc":"2.0","id":3,"method":"session.create","params":{"cwd":"%s",'
                '"title":"%s"}}' % (workdir, title)).encode()
        c.send(line)
        err = json.loads(c.line())
        assert err["error"]["code"] in (-32700, -32602), err
        assert "lone UTF-16 surrogate" in err["error"]["message"], err
        assert "valid Unicode" in err["error"]["message"], err
    c.send({"jsonrpc": "2.0", "id": 4, "method": "session.list"})
    assert json.loads(c.line())["result"]["sessions"] == []  # nothing was created
