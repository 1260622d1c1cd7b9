"""A small, blocking JSON-RPC peer for end-to-end tests: it speaks only the wire (PROTOCOL.md
§1–§3) and mirrors a lane with ``protocol.mirror`` (pure ``protocol.codec`` + ``protocol.apply``),
so the tests that use it guard the daemon's socket behaviour, not its internals."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from protocol.mirror import Mirror


class Wire:
    """One connection: ``call`` sends a request and returns its whole answer (a dict with
    ``result`` or ``error``); stream notifications read meanwhile are kept in ``notes``."""

    def __init__(self, path: Path, *, approvals: bool = False, timeout: float = 60.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)  # a liveness bound, not a speed target
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.next_id = 0
        self.notes: list[dict] = []
        #: Bytes of each stream notification line, in arrival order.
        self.note_sizes: list[int] = []
        init = self.call("initialize", {"protocolVersion": 1,
                                        "capabilities": {"approvals": approvals}})
        assert "result" in init, init

    def _read(self) -> dict:
        line = self.file.readline()
        assert line.endswith(b"\n"), f"connection closed: {line[:200]!r}"
        msg = json.loads(line)
        if isinstance(msg, dict) and msg.get("method") == "stream":
            self.notes.append(msg["params"])
            self.note_sizes.append(len(line))
        return msg

    def call(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        rid = self.next_id
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            answer = self._read()
            if isinstance(answer, dict) and answer.get("id") == rid:
                return answer

    def result(self, method: str, params: dict | None = None) -> Any:
        answer = self.call(method, params)
        assert "result" in answer, answer
        return answer["result"]

    def error(self, method: str, params: dict | None = None) -> dict:
        answer = self.call(method, params)
        assert "error" in answer, answer
        return answer["error"]

    def next_note(self) -> dict:
        """The next stream notification (blocking, within the socket timeout)."""
        while not self.notes:
            self._read()
        return self.notes.pop(0)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class Lane:
    """A subscription's mirror: ``views()`` yields the lane value after each batch."""

    def __init__(self, wire: Wire, session_id: str) -> None:
        self.wire = wire
        self.sub_id = wire.result("subscribe", {"sessionId": session_id})["subscriptionId"]
        self.mirror = Mirror()

    def _feed(self, note: dict) -> Any:
        assert note["subscriptionId"] == self.sub_id
        self.mirror.feed(note["seq"], note["ops"])
        return self.mirror.value

    def next(self) -> Any:
        return self._feed(self.wire.next_note())

    @property
    def value(self) -> Any:
        return self.mirror.value


def events(wire: Wire, session_id: str) -> list[dict]:
    """Every event of the session (session.events, paged)."""
    out: list[dict] = []
    after = -1
    while True:
        page = wire.result("session.events", {"sessionId": session_id, "afterSeq": after,
                                              "limit": 1000})
        out += page["events"]
        if not page["events"] or page["events"][-1]["seq"] >= page["lastSeq"]:
            return out
        after = page["events"][-1]["seq"]
