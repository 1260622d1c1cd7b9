"""The host's event loop: one selector, callbacks per fd and direction (HOST.md §2).

Theory of operation: the host is single-threaded (so that bwrap's ``--die-with-parent``, a
thread-scoped ``PR_SET_PDEATHSIG``, means "the host"); everything it waits for is an fd:
the output (PTY master or pipe), the stdin end, the control listener and connections, and the
SIGCHLD wakeup pipe (:class:`SignalPipe`: ``signal.set_wakeup_fd`` turns the signal into a
readable byte, so a child's exit wakes the select). :class:`Reactor` keeps, per fd, a read
callback and a write callback (either may be None); it registers the fd for exactly the
directions that have one, so one fd (a PTY master is both output and stdin) can be read and
written by different owners. Timers are the host's own deadlines: it passes the time to the
next one to :meth:`Reactor.poll`.
"""

from __future__ import annotations

import os
import selectors
import signal

__all__ = ["Reactor", "SignalPipe"]


class Reactor:
    """A selector with a read and a write callback per fd."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._cbs: dict[int, list] = {}

    def _apply(self, fd: int) -> None:
        read_cb, write_cb = self._cbs.get(fd, (None, None))
        events = (selectors.EVENT_READ if read_cb else 0) | (
            selectors.EVENT_WRITE if write_cb else 0)
        registered = fd in self._sel.get_map()
        if not events:
            self._cbs.pop(fd, None)
            if registered:
                self._sel.unregister(fd)
        elif registered:
            self._sel.modify(fd, events)
        else:
            self._sel.register(fd, events)

    def want_read(self, fd: int, callback) -> None:
        """Call ``callback()`` when ``fd`` is readable (None: stop)."""
        self._cbs.setdefault(fd, [None, None])[0] = callback
        self._apply(fd)

    def want_write(self, fd: int, callback) -> None:
        """Call ``callback()`` when ``fd`` is writable (None: stop)."""
        self._cbs.setdefault(fd, [None, None])[1] = callback
        self._apply(fd)

    def forget(self, fd: int) -> None:
        """Drop both callbacks of ``fd`` (call before closing it)."""
        self._cbs.pop(fd, None)
        if fd in self._sel.get_map():
            self._sel.unregister(fd)

    def poll(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (None: forever) and run the ready callbacks."""
        for key, mask in self._sel.select(timeout):
            fd = key.fd
            if mask & selectors.EVENT_READ:
                cbs = self._cbs.get(fd)
                if cbs and cbs[0]:
                    cbs[0]()
            if mask & selectors.EVENT_WRITE:
                cbs = self._cbs.get(fd)
                if cbs and cbs[1]:
                    cbs[1]()


class SignalPipe:
    """SIGCHLD as a readable pipe (``signal.set_wakeup_fd``)."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)

    def drain(self) -> None:
        """Empty the pipe (the bytes only mean "a signal came")."""
        try:
            while os.read(self.read_fd, 4096):
                pass
        except BlockingIOError:
            pass
