"""The control protocol's connections: accept, peer check, hello, JSON lines (HOST.md §4).

Theory of operation: the listener is a Unix stream socket *file* in the call's directory
(:data:`SOCKET_NAME`, 0600), inside the daemon's state directory, which every confining
sandbox masks (bwrap mounts a tmpfs over it, with or without a shared network namespace; the
Landlock launcher's seccomp filter refuses ``AF_UNIX`` sockets), so no sandboxed command can
reach it. (An abstract socket was reachable from a bwrap sandbox with ``network = true``: a
command flooded every host's slots and broke other sessions' calls.) A directory path may be
longer than a socket address allows (108 bytes), so both ends bind and connect through the
directory's descriptor (:func:`socket_path`: ``/proc/self/fd/N/control.sock``).
:func:`accept_peer` also checks ``SO_PEERCRED`` of every connection (the peer's uid must be the host's euid); the first line must then be
``{"hello": 1, "secret": <spec secret>}`` (compared in constant time), else the connection is
closed. At most :data:`MAX_CONNECTIONS` are open: a new one past that evicts the oldest that
has not said hello yet (or one silent for :data:`HELLO_SECONDS`), else it is refused -- so a
process of the same uid that opens connections and stays silent cannot lock the daemon out. Anything malformed -- a line that
is not a JSON object with an int ``id``, a line over :data:`MAX_LINE`, a wrong hello -- closes
*that* connection, never the host. A well-formed request with bad fields gets a
``bad-request`` reply (:func:`parse_request` validates; :class:`RequestError` carries the code).

:class:`Connection` never blocks the host: the socket is non-blocking, replies and events go
to a bounded output buffer flushed when the socket is writable, and a peer that lets more than
:data:`MAX_OUTPUT` bytes pile up (a slow or dead daemon) is dropped. The daemon does not
re-attach yet (issue 13): a dropped daemon connection counts as a lost daemon, which ends the
command (``on_daemon_loss``, HOST.md §7). While a request's reply is deferred (a ``write`` waits until its bytes
reached the command), the connection reads on -- a ``terminate`` or ``status`` behind a
write that the command does not read is still served -- until :data:`MAX_DEFERRED` replies
are outstanding; then it reads no further line until one is answered. That bounds the
pending input per connection (4 x 1 MiB).

What the host answers (HOST.md §4, with these precisions): a wrong or missing hello closes the
connection without a reply; ``attach`` and ``status`` carry the state ``{"state":
"running"|"exited", "endOffset", "firstOffset", "totalLines", "record"?}`` (``attach`` as
``"state": {...}``, ``status`` flat), and an ``attach`` after the end is followed by the
``exit`` event at once; ``signal`` answers ``{"signalled": n}`` (processes hit);
``terminate`` after the child exited but before the record cuts the ``eof_grace`` wait short
(``ok``), after the record it is ``not-running``; a ``write`` into a pipe the command closed
is ``no-stdin``; on a terminal ``close-stdin`` writes VEOF and input stays open.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import socket
import struct
import time

__all__ = ["Connection", "MAX_CONNECTIONS", "MAX_LINE", "MAX_OUTPUT", "MAX_WRITE",
           "RequestError", "SIGNALS", "accept_peer", "parse_request"]

#: Connections open at once (the daemon needs one; a few more for re-attach races and tools).
MAX_CONNECTIONS = 8
#: Longest control line (bytes, newline excluded): a 1 MiB write is ~1.4 MiB of base64.
MAX_LINE = 4 * 1_048_576
#: Output bytes a connection may leave unread before it is dropped.
MAX_OUTPUT = 256 * 1024
#: Deferred replies (queued writes) per connection before it reads no further request.
MAX_DEFERRED = 4
#: Seconds a connection may stay without its hello once others wait for a slot.
HELLO_SECONDS = 5.0
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
    """A request that cannot be served: ``code`` (HOST.md §4) and a sentence."""

    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(sentence)
        self.code = code
        self.sentence = sentence



#: The control socket's file name in the call directory.
SOCKET_NAME = "control.sock"


def socket_path(dirfd: int) -> str:
    """The control socket's address through an open descriptor of the call directory."""
    return f"/proc/self/fd/{dirfd}/{SOCKET_NAME}"


def listen_in(directory: str) -> socket.socket:
    """Bind and listen on the control socket of ``directory`` (0600; a stale one replaced)."""
    dirfd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        path = socket_path(dirfd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC
                                 | socket.SOCK_NONBLOCK)
        old = os.umask(0o177)
        try:
            listener.bind(path)
        finally:
            os.umask(old)
        listener.listen(MAX_CONNECTIONS)
        return listener
    finally:
        os.close(dirfd)

def same_secret(given: bytes, expected: bytes) -> bool:
    """Constant-time equality (``hmac.compare_digest`` without importing ``hashlib``, whose
    OpenSSL load costs every host's start-up ~7 ms)."""
    if len(given) != len(expected):
        return False
    diff = 0
    for a, b in zip(given, expected):
        diff |= a ^ b
    return diff == 0


def accept_peer(listener: socket.socket) -> socket.socket | None:
    """Accept one connection; None (closed) when the peer's uid is not ours."""
    while True:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return None
        except ConnectionAbortedError:
            continue
        break
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.geteuid():
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
        self.deferred = 0  # requests whose reply comes later (writes in the stdin queue)
        self.after: list[dict] = []  # messages to send right after the current reply
        self._in_lines = False
        self.closed = False
        self._want_write = False
        self.opened_at = time.monotonic()
        reactor.want_read(self.fd, self._readable)

    @property
    def pending_output(self) -> int:
        return len(self._out)

    def send(self, obj: dict) -> None:
        """Queue one line; drops the connection past :data:`MAX_OUTPUT`."""
        if self.closed:
            return
        self.send_line(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def send_line(self, line: bytes) -> None:
        """Queue one encoded line (ending in a newline); drops the connection past
        :data:`MAX_OUTPUT`."""
        if self.closed:
            return
        self._out += line
        self._writable()
        if len(self._out) > MAX_OUTPUT:
            self.close()

    def reply(self, request_id: int, fields: dict) -> None:
        """Send a deferred reply and read requests again."""
        self.send({"id": request_id, **fields})
        if self.deferred:
            self.deferred -= 1
            if self.deferred == MAX_DEFERRED - 1 and not self.closed:
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
        if bool(self._out) != self._want_write:  # epoll changes only when the need does
            self._want_write = bool(self._out)
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
        while not self.closed and self.deferred < MAX_DEFERRED:
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
                    or not same_secret(secret.encode(), self._secret):
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
            self.deferred += 1
            if self.deferred >= MAX_DEFERRED:
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
