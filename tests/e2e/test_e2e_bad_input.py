"""Bad input gets a clear error and loses nothing (PROTOCOL.md §1, §4): raw bytes on the socket."""

from __future__ import annotations

import json
import os
import socket
import stat

import trio

from client.api import connect


class RawClient:
    """A deliberately dumb NDJSON peer, so the test controls every byte it sends."""

    def __init__(self, path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.next_id = 0

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> dict | list:
        line = self.file.readline()
        assert line.endswith(b"\n"), line
        return json.loads(line)

    def call(self, method: str, params: dict | None = None):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send_raw(json.dumps(msg).encode() + b"\n")
        return self.recv()

    def initialize(self) -> None:
        r = self.call("initialize", {"protocolVersion": 1, "client": {"name": "raw", "version": "0"}})
        assert r["result"]["protocolVersion"] == 1

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def _error(resp) -> int:
    return resp["error"]["code"]


async def test_bad_input_is_answered_and_everyone_keeps_working(daemon, workdir):
    # A bystander streams a live command the whole time.
    async with connect(daemon.socket, "bystander") as bystander:
        sid = await bystander.create_session(str(workdir))
        sub = await bystander.subscribe(sid)
        call_id = await bystander.run_tool(
            sid, "for i in $(seq 1 100); do echo tick $i; sleep 0.01; done", approved=True
        )

        def hostile() -> None:
            raw = RawClient(daemon.socket)
            # Before initialize: -32002, connection open.
            assert _error(raw.call("session.list", {})) == -32002
            raw.initialize()
            # Invalid JSON: -32700.
            raw.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": \n')
            r = raw.recv()
            assert _error(r) == -32700 and r["id"] is None
            # An over-size line (16 MiB limit): discarded through its newline, -32600, id null.
            raw.send_raw(b'{"x": "' + b"a" * (17 * 1024 * 1024) + b'"}\n')
            r = raw.recv()
            assert _error(r) == -32600 and r["id"] is None
            # Nesting deep enough to exhaust a recursive decoder: -32700, connection open.
            raw.send_raw(b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n")
            r = raw.recv()
            assert _error(r) == -32700 and r["id"] is None
            # An empty batch: one error object, not an array (JSON-RPC 2.0).
            raw.send_raw(b"[]\n")
            r = raw.recv()
            assert isinstance(r, dict) and _error(r) == -32600
            # Unknown method: -32601.
            assert _error(raw.call("session.explode", {})) == -32601
            # Bad params: -32602, naming the field.
            r = raw.call("session.events", {"sessionId": sid, "limit": 10_001})
            assert _error(r) == -32602 and "limit" in r["error"]["message"]
            r = raw.call("tool.run", {"sessionId": sid, "name": "bash", "arguments": {"command": 5}})
            assert _error(r) == -32602
            # Path-like session ids are refused before they can touch the filesystem.
            for bad in ("../../etc", "..", "a/b", "__proto__", "x" * 65, ""):
                r = raw.call("session.get", {"sessionId": bad})
                assert _error(r) == -32602, (bad, r)
            r = raw.call("tool.run", {"sessionId": sid, "name": "bash",
                                      "arguments": {"command": "true"}, "callId": "../x"})
            assert _error(r) == -32602
            # Unknown session and tool and call.
            assert _error(raw.call("session.get", {"sessionId": "nosuchsession"})) == -32004
            r = raw.call("tool.run", {"sessionId": sid, "name": "rm-rf", "arguments": {}})
            assert _error(r) == -32012
            assert _error(raw.call("tool.wait", {"sessionId": sid, "callId": "nope"})) == -32006
            # A batch: each element answered, notifications get nothing.
            raw.send_raw(json.dumps([
                {"jsonrpc": "2.0", "id": "b1", "method": "session.get", "params": {"sessionId": sid}},
                {"jsonrpc": "2.0", "method": "daemon.status"},
                {"jsonrpc": "2.0", "id": "b2", "method": "nope"},
                42,
            ]).encode() + b"\n")
            batch = raw.recv()
            assert isinstance(batch, list) and len(batch) == 3
            by_id = {r.get("id"): r for r in batch}
            assert by_id["b1"]["result"]["sessionId"] == sid
            assert _error(by_id["b2"]) == -32601
            assert _error(by_id[None]) == -32600
            # The same connection still works after all of that.
            r = raw.call("session.get", {"sessionId": sid})
            assert r["result"]["sessionId"] == sid
            raw.close()

        await trio.to_thread.run_sync(hostile)
        # The bystander's stream and call were untouched.
        view = await sub.next_view()
        while not any(r["callId"] == call_id for r in view["recent"]):
            view = await sub.next_view()
        result = await bystander.wait(sid, call_id)
        assert result["exitCode"] == 0
        assert result["content"].count("tick") == 100
    assert daemon.proc.poll() is None


async def test_socket_and_state_permissions(daemon):
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.socket.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(daemon.state_dir).st_mode) == 0o700


async def test_unsupported_protocol_version(daemon):
    def go() -> None:
        raw = RawClient(daemon.socket)
        r = raw.call("initialize", {"protocolVersion": 2})
        assert _error(r) == -32003
        raw.initialize()
        raw.close()

    await trio.to_thread.run_sync(go)
