"""The control protocol's connections: accept, peer check, hello, JSON lines (plan §C).

Theory of operation: the listener is an abstract Unix stream socket (``dsh-host-<32 hex>``).
Abstract sockets have no file permissions, so :func:`accept_peer` checks ``SO_PEERCRED`` of
every connection (the peer's uid must be the host's euid) and refuses connections past
:data:`MAX_CONNECTIONS`; the first line must then be ``{"hello": 1, "secret": <spec secret>}``
(compared in constant time), else the connection is closed. Anything malformed -- a line that
is not a JSON object with an int ``id``, a line over :data:`MAX_LINE`, a wrong hello -- closes
*that* connection, never the host. A well-formed request with bad fields gets a
``bad-request`` reply (:func:`parse_request` validates; :class:`RequestError` carries the code).

:class:`Connection` never blocks the host: the socket is non-blocking, replies and events go
to a bounded output buffer flushed when the socket is writable, and a peer that lets more than
:data:`MAX_OUTPUT` bytes pile up (a slow or dead daemon) is dropped -- the daemon re-attaches
and reads the state. While a request's reply is deferred (a ``write`` waits until its bytes
reached the command), the connection reads no further lines: one request in flight per
connection bounds the pending input.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import math
import os
import socket
import struct

__all__ = ["Connection", "MAX_CONNECTIONS", "MAX_LINE", "MAX_OUTPUT", "MAX_WRITE",
           "RequestError", "SIGNALS", "accept_peer", "parse_request"]

#: Connections open at once (the daemon needs one; a few more for re-attach races and tools).
MAX_CONNECTIONS = 8
#: Longest control line (bytes, newline excluded): a 1 MiB write is ~1.4 MiB of base64.
MAX_LINE = 4 * 1_048_576
#: Output bytes a connection may leave unread before it is dropped.
MAX_OUTPUT = 256 * 1024
#: Largest decoded ``write``.
MAX_WRITE = 1_048_576
#: Bytes asked of the socket per read.
RECV_CHUNK = 262_144
#: Signal names ``signal`` accepts.
SIGNALS = ("INT", "TERM", "HUP", "QUIT", "KILL", "USR1", "USR2", "WINCH", "CONT", "STOP", "TSTP")
#: Largest ``grace`` of ``terminate`` (seconds).
MAX_GRACE = 3600.0
_OPS = ("attach", "write", "close-stdin", "resize", "signal", "terminate", "status", "release")


class RequestError(Exception):
    """A request that cannot be served: ``code`` (plan §C) and a sentence."""

    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(sentence)
        self.code = code
        self.sentence = sentence


def accept_peer(listener: socket.socket, count: int) -> socket.socket | None:
    """Accept one connection; None (closed) when the peer's uid is not ours or ``count``
    connections are already open."""
    try:
        sock, _ = listener.accept()
    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.geteuid() or count >= MAX_CONNECTIONS:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def _number(msg: dict, key: str, default: float, low: float, high: float) -> float:
    value = msg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or not low <= value <= high:
        raise RequestError("bad-request", f"{key} must be a number from {low} to {high}")
    return float(value)


def _size(msg: dict, key: str) -> int:
    value = msg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10000:
        raise RequestError("bad-request", f"{key} must be an integer from 1 to 10000")
    return value


def parse_request(msg: dict) -> tuple[str, dict]:
    """``(op, arguments)`` of a request, validated; raises :class:`RequestError`."""
    op = msg.get("op")
    if op not in _OPS:
        raise RequestError("bad-request", f"unknown op {op!r}; known: {', '.join(_OPS)}")
    if op == "write":
        data = msg.get("data")
        if not isinstance(data, str):
            raise RequestError("bad-request", "write needs data: a base64 string")
        if len(data) > (MAX_WRITE + 2) // 3 * 4 + 4:
            raise RequestError("too-big", f"a write carries at most {MAX_WRITE} bytes")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("bad-request", "write's data is not valid base64") from None
        if len(raw) > MAX_WRITE:
            raise RequestError("too-big", f"a write carries at most {MAX_WRITE} bytes")
        return op, {"data": raw}
    if op == "resize":
        return op, {"cols": _size(msg, "cols"), "rows": _size(msg, "rows")}
    if op == "signal":
        name = msg.get("signal")
        if name not in SIGNALS:
            raise RequestError("bad-request", f"signal must be one of {', '.join(SIGNALS)}")
        return op, {"signal": name}
    if op == "terminate":
        reason = msg.get("reason", "cancelled")
        if reason not in ("cancelled", "killed"):
            raise RequestError("bad-request", "reason must be 'cancelled' or 'killed'")
        return op, {"grace": _number(msg, "grace", 2.0, 0.0, MAX_GRACE), "reason": reason}
    return op, {}


class Connection:
    """One control connection (see the module doc). ``on_request(conn, id, op, args)``
    returns the reply's fields, or None when it will call :meth:`reply` later."""

    def __init__(self, sock: socket.socket, reactor, secret: str, on_request, on_close) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self._reactor = reactor
        self._secret = secret.encode()
        self._on_request = on_request
        self._on_close = on_close
        self._in = bytearray()
        self._out = bytearray()
        self.greeted = False
        self.attached = False
        self.busy = False  # a deferred reply is outstanding
        self.after: list[dict] = []  # messages to send right after the current reply
        self._in_lines = False
        self.closed = False
        reactor.want_read(self.fd, self._readable)

    @property
    def pending_output(self) -> int:
        return len(self._out)

    def send(self, obj: dict) -> None:
        """Queue one line; drops the connection past :data:`MAX_OUTPUT`."""
        if self.closed:
            return
        self._out += json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        self._writable()
        if len(self._out) > MAX_OUTPUT:
            self.close()

    def reply(self, request_id: int, fields: dict) -> None:
        """Send a deferred reply and read requests again."""
        self.send({"id": request_id, **fields})
        if self.busy:
            self.busy = False
            if not self.closed:
                self._reactor.want_read(self.fd, self._readable)
                if not self._in_lines:
                    self._lines()

    def _writable(self) -> None:
        if self.closed:
            return
        try:
            while self._out:
                n = self.sock.send(self._out)
                del self._out[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.close()
            return
        self._reactor.want_write(self.fd, self._writable if self._out else None)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(RECV_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        self._in += data
        self._lines()

    def _lines(self) -> None:
        self._in_lines = True
        try:
            self._lines_now()
        finally:
            self._in_lines = False

    def _lines_now(self) -> None:
        while not self.closed and not self.busy:
            end = self._in.find(b"\n")
            if end < 0:
                if len(self._in) > MAX_LINE:
                    self.close()
                return
            if end > MAX_LINE:
                self.close()
                return
            line = bytes(self._in[:end])
            del self._in[:end + 1]
            self._line(line)

    def _line(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            self.close()
            return
        if not self.greeted:
            secret = msg.get("secret")
            if msg.get("hello") != 1 or not isinstance(secret, str) \
                    or not hmac.compare_digest(secret.encode(), self._secret):
                self.close()
                return
            self.greeted = True
            self.send({"hello": 1, "version": 1, "pid": os.getpid()})
            return
        request_id = msg.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, int):
            self.close()
            return
        try:
            op, args = parse_request(msg)
            fields = self._on_request(self, request_id, op, args)
        except RequestError as exc:
            fields = {"ok": False, "code": exc.code, "error": exc.sentence}
        if fields is None:
            self.busy = True
            self._reactor.want_read(self.fd, None)
        else:
            self.send({"id": request_id, **fields})
            while self.after:
                self.send(self.after.pop(0))

    def close(self) -> None:
        """Close (idempotent); the host forgets the connection."""
        if self.closed:
            return
        self.closed = True
        self._reactor.forget(self.fd)
        self.sock.close()
        self._on_close(self)
