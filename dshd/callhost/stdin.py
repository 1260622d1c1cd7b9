"""The command's stdin: writes in order, each replied to once written (HOST.md §4).

Theory of operation: the stdin end (the write end of the stdin pipe, or the PTY master in
terminal mode) is non-blocking. ``write`` and ``close-stdin`` requests join one FIFO; the
head is written whenever the fd is writable, and a ``write`` is answered (``{"written": n}``)
only once all its bytes went to the kernel: end-to-end back-pressure. A connection with
``MAX_DEFERRED`` (4) unanswered requests reads no further one
(:class:`~control.Connection`), so the queue holds at most 4 entries per connection
(<= 32 MiB for 8 connections). ``close-stdin`` closes the pipe's
write end (the command reads end of file); on a PTY it writes the terminal's VEOF character
(``c_cc[VEOF]``, normally Ctrl-D: end of file for a reader in canonical mode at the start of a
line) and stdin stays open. When the command ends, or it closed its end of the pipe
(``EPIPE``), every pending request fails (``not-running`` / ``no-stdin``).
"""

from __future__ import annotations

import collections
import os
import termios

try:
    from .control import RequestError
except ImportError:  # run as a script (main.py): the siblings are top-level modules
    from control import RequestError

__all__ = ["Stdin"]


class Stdin:
    """The pending input of one command; ``fd`` None means the call has no stdin."""

    def __init__(self, reactor, fd: int | None, tty: bool) -> None:
        self._reactor = reactor
        self.fd = fd
        self.tty = tty
        self._queue: collections.deque = collections.deque()  # [conn, id, view | None, n]
        self.ended: str | None = None  # why no more input is accepted (a code)

    def check(self) -> None:
        """Raise the reason a request cannot be queued, if any."""
        from_reason = {"not-running": "the command has ended",
                       "no-stdin": "the call's stdin is closed"}
        if self.ended is not None:
            raise RequestError(self.ended, from_reason[self.ended])
        if self.fd is None:
            raise RequestError("no-stdin", "the call was started without stdin "
                                     "(stdin \"null\" and no terminal)")

    def submit(self, conn, request_id: int, data: bytes | None) -> None:
        """Queue a write (``data``) or a close-stdin (None); the reply comes later."""
        self.check()
        self._queue.append([conn, request_id, None if data is None else memoryview(data), 0])
        self._reactor.want_write(self.fd, self._writable)

    def _writable(self) -> None:
        while self._queue:
            entry = self._queue[0]
            conn, request_id, view, written = entry
            if view is None:
                self._queue.popleft()
                self._close_stdin(conn, request_id)
                continue
            try:
                n = os.write(self.fd, view[written:]) if written < len(view) else 0
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EPIPE: the command closed its stdin; EIO: the terminal hung up
                self.end("no-stdin", "the command closed its stdin")
                return
            entry[3] = written = written + n
            if written < len(view):
                return
            self._queue.popleft()
            conn.reply(request_id, {"ok": True, "written": written})
        if self.fd is not None:
            self._reactor.want_write(self.fd, None)

    def _close_stdin(self, conn, request_id: int) -> None:
        if self.tty:
            try:
                veof = termios.tcgetattr(self.fd)[6][termios.VEOF]
                os.write(self.fd, veof if isinstance(veof, bytes) else bytes([veof]))
            except OSError as exc:
                conn.reply(request_id, _fields("not-running", f"the terminal is gone ({exc})"))
                return
            conn.reply(request_id, {"ok": True})
            return
        conn.reply(request_id, {"ok": True})
        self.end("no-stdin", "the call's stdin is closed")

    def end(self, code: str, sentence: str) -> None:
        """No more input (``code``): fail what is pending; a pipe's write end is closed."""
        if self.ended is None or code == "not-running":
            self.ended = code
        while self._queue:
            conn, request_id, _, _ = self._queue.popleft()
            conn.reply(request_id, _fields(code, sentence))
        if self.fd is not None:
            self._reactor.want_write(self.fd, None)
            if not self.tty:
                self._reactor.forget(self.fd)
                os.close(self.fd)
            self.fd = None

    def drop(self, conn) -> None:
        """Forget the entries of a closed connection (their bytes are not written)."""
        keep = [e for i, e in enumerate(self._queue) if e[0] is not conn or (i == 0 and e[3])]
        self._queue = collections.deque(keep)


def _fields(code: str, sentence: str) -> dict:
    return {"ok": False, "code": code, "error": sentence}
