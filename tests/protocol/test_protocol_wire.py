"""The shared structs against a real dshd (real socket, real subprocess): what ``initialize``
says it has, and the answers a client decodes with ``protocol.methods`` / ``protocol.events``."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from pathlib import Path

import msgspec
import pytest

from dshd.storage.format import KNOWN_TYPES
from dshd.testing import DshdProcess
from protocol import events, methods, rpc


class Peer:
    """A blocking JSON-RPC peer that keeps each answer's raw bytes."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(60)  # a liveness bound
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.next_id = 0

    def raw(self, method: str, params: dict | None = None) -> bytes:
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            line = self.file.readline()
            assert line.endswith(b"\n"), line
            answer = json.loads(line)
            if answer.get("id") == self.next_id:
                return line

    def call(self, method: str, params: dict | None = None) -> dict:
        return json.loads(self.raw(method, params))

    def result(self, method: str, params: dict | None = None):
        """The result decoded with the method's result struct of the shared table."""
        (answer,) = rpc.parse_message(self.raw(method, params))
        assert isinstance(answer, rpc.Response), answer
        return msgspec.json.decode(answer.result, type=methods.METHODS[method].result)


@pytest.fixture
def peer():
    root = Path(tempfile.mkdtemp(prefix="dsh-proto-"))
    daemon = DshdProcess(root)
    try:
        daemon.start()
        p = Peer(daemon.socket)
        yield p, root
        p.sock.close()
    finally:
        daemon.close()
        shutil.rmtree(root, ignore_errors=True)


def test_initialize_lists_the_methods_and_capabilities_the_daemon_has(peer):
    """Before: the answer had no ``methods`` and no ``capabilities``."""
    p, _ = peer
    init = p.result("initialize", {"protocolVersion": 1})
    assert init.methods == sorted(methods.METHODS)
    assert init.capabilities == methods.DaemonCapabilities(approvals=True)
    assert init.tools == ["bash"]
    for name in init.methods:  # every listed method is answered (not -32601)
        answer = p.call(name, {})
        assert answer.get("error", {}).get("code") != -32601, (name, answer)
    assert p.call("no.such", {})["error"]["code"] == -32601


def test_a_session_round_trips_through_the_shared_structs(peer):
    p, root = peer
    p.result("initialize", {"protocolVersion": 1})
    work = root / "work"
    work.mkdir()
    created = p.result("session.create", {"cwd": str(work), "title": None})
    sid = created.session_id
    run = p.result("tool.run", {"sessionId": sid, "name": "bash", "callId": "c1",
                                "approved": True,
                                "arguments": {"command": "echo hi", "timeout": 30}})
    assert run == methods.ToolRunResult(call_id="c1")
    assert p.result("tool.run", {"sessionId": sid, "name": "bash", "callId": "c1",
                                 "arguments": {"timeout": 30, "command": "echo hi"}}
                    ).existing is True  # the same call (key order is not another call)
    result = p.result("tool.wait", {"sessionId": sid, "callId": "c1", "timeout": 30})
    assert result["isError"] is False and result["exitCode"] == 0, result
    info = p.result("session.get", {"sessionId": sid})
    assert (info.session_id, info.cwd, info.approval_policy) == (sid, str(work.resolve()), "ask")
    assert info.title is None and info.damaged is msgspec.UNSET
    listed = p.result("session.list", {})
    assert [s.session_id for s in listed.sessions] == [sid]
    page = p.result("session.events", {"sessionId": sid})
    typed = events.decode_events(page.events)
    assert [e.seq for e in typed] == list(range(page.last_seq + 1))
    assert not [e for e in typed if isinstance(e, events.UnknownEvent)]
    call = next(e for e in typed if isinstance(e, events.ToolCall))
    assert (call.data.call_id, json.loads(call.data.arguments)["command"]) == ("c1", "echo hi")
    done = next(e for e in typed if isinstance(e, events.ToolResultEvent))
    assert done.data.exit_code == 0 and done.data.is_error is False


def test_every_event_type_the_log_knows_is_typed():
    assert set(KNOWN_TYPES) <= events.EVENT_TYPES
    unknown = b'{"seq":9,"time":1,"type":"future/thing","data":{"x":1},"ignorable":true}'
    event = events.decode_event(unknown)
    assert isinstance(event, events.UnknownEvent) and event.data == {"x": 1}
    with pytest.raises(msgspec.ValidationError):  # a known type with the wrong data shape
        events.decode_event(b'{"seq":1,"time":1,"type":"tool/call","data":{"callId":5}}')
