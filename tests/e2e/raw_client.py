"""A blocking client of the raw channel (PROTOCOL.md §3.2, HOST.md §6) for end-to-end tests:
``tests/e2e/wire.Wire`` plus the ``output`` notifications of its followers, kept in order, and
helpers that run a call and collect a follower's bytes. It speaks only the wire."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from .wire import Wire


class RawWire(Wire):
    """A :class:`Wire` that also keeps ``output`` notifications (``outputs``) and counts the
    bytes of each line it read (``read_bytes``)."""

    def __init__(self, path: Path, *, rcvbuf: int | None = None, timeout: float = 120.0) -> None:
        self.outputs: list[dict] = []
        self.read_bytes = 0
        self._rcvbuf = rcvbuf
        super().__init__(path, timeout=timeout)

    def _read(self) -> dict:
        line = self.file.readline()
        assert line.endswith(b"\n"), f"connection closed: {line[:200]!r}"
        self.read_bytes += len(line)
        msg = json.loads(line)
        if isinstance(msg, dict) and msg.get("method") == "output":
            self.outputs.append(msg["params"])
        elif isinstance(msg, dict) and msg.get("method") == "stream":
            self.notes.append(msg["params"])
        return msg

    def next_output(self) -> dict:
        while not self.outputs:
            self._read()
        return self.outputs.pop(0)


class Collected:
    """What one follower delivered: its bytes (in order, offsets checked), its gaps, its end."""

    def __init__(self, start: int, expected: bytes | None = None) -> None:
        self.expected = expected  # when given, every chunk is checked at its offset
        self.offset = start
        self.data = bytearray()
        self.sha = hashlib.sha256()
        self.keep = True
        self.gaps: list[dict] = []
        self.end: dict | None = None
        self.notes = 0

    def feed(self, note: dict) -> None:
        self.notes += 1
        if "gap" in note:
            assert note["gap"]["from"] == self.offset, note
            self.gaps.append(note["gap"])
            self.offset = note["gap"]["to"]
            return
        assert note["offset"] == self.offset, (note.get("offset"), self.offset)
        if note.get("eof") or "error" in note:
            self.end = note
            return
        chunk = base64.b64decode(note["data"])
        assert 0 < len(chunk) <= 256 * 1024, len(chunk)
        if self.expected is not None:
            assert chunk == self.expected[self.offset:self.offset + len(chunk)], self.offset
        self.offset += len(chunk)
        self.sha.update(chunk)
        if self.keep:
            self.data += chunk


def session(w: Wire, cwd: Path, **params: Any) -> str:
    return w.result("session.create", {"cwd": str(cwd), **params})["sessionId"]


def run(w: Wire, sid: str, command: str, **arguments: Any) -> str:
    return w.result("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                 "arguments": {"command": command, **arguments}})["callId"]


def wait(w: Wire, sid: str, call_id: str, timeout: float = 120) -> dict:
    return w.result("tool.wait", {"sessionId": sid, "callId": call_id, "timeout": timeout})


def read_all(w: Wire, sid: str, call_id: str, start: int = 0) -> tuple[bytes, dict]:
    """Every byte from ``start`` to the end now, by ``tool.read`` pages; the last answer."""
    out = bytearray()
    offset = start
    while True:
        page = w.result("tool.read", {"sessionId": sid, "callId": call_id, "offset": offset})
        assert page["offset"] == offset
        chunk = base64.b64decode(page["data"])
        out += chunk
        offset += len(chunk)
        if offset >= page["endOffset"]:
            return bytes(out), page


def wait_output(w: Wire, sid: str, call_id: str, needle: bytes, timeout: float = 60) -> bytes:
    """Poll ``tool.read`` from 0 until the output contains ``needle`` (a liveness bound)."""
    deadline = time.monotonic() + timeout
    while True:
        data, _ = read_all(w, sid, call_id)
        if needle in data:
            return data
        assert time.monotonic() < deadline, f"{needle!r} not in the output within {timeout} s: {data[-300:]!r}"
        time.sleep(0.05)


def wait_end_offset(w: Wire, sid: str, call_id: str, at_least: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        page = w.result("tool.read", {"sessionId": sid, "callId": call_id, "offset": 0,
                                      "limit": 0})
        if page["endOffset"] >= at_least:
            return page
        assert time.monotonic() < deadline, f"endOffset {page['endOffset']} < {at_least}"
        time.sleep(0.05)


def follow(w: RawWire, sid: str, call_id: str, offset: int = 0) -> str:
    return w.result("tool.follow", {"sessionId": sid, "callId": call_id,
                                    "offset": offset})["followId"]


def collect(w: RawWire, follow_id: str, start: int = 0, *, keep: bool = True,
            expected: bytes | None = None) -> Collected:
    """Read ``follow_id``'s notifications until its last one."""
    got = Collected(start, expected)
    got.keep = keep
    while got.end is None:
        note = w.next_output()
        assert note["followId"] == follow_id, note
        got.feed(note)
    return got


def seq_bytes(first: int, last: int) -> bytes:
    """What ``seq FIRST LAST`` prints."""
    return "".join(f"{n}\n" for n in range(first, last + 1)).encode()


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")
