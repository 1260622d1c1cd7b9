"""The host's event loop: one epoll, callbacks per fd and direction (HOST.md §2).

Theory of operation: the host is single-threaded (so that bwrap's ``--die-with-parent``, a
thread-scoped ``PR_SET_PDEATHSIG``, means "the host"); everything it waits for is an fd:
the output (PTY master or pipe), the stdin end, the control listener and connections, and the
SIGCHLD wakeup pipe (:class:`SignalPipe`: ``signal.set_wakeup_fd`` turns the signal into a
readable byte, so a child's exit wakes the poll). :class:`Reactor` keeps, per fd, a read
callback and a write callback (either may be None); it registers the fd (level-triggered)
for exactly the directions that have one, and calls ``epoll_ctl`` only when that set
changes, so one fd (a PTY master is both output and stdin) can be read and written by
different owners. It drives ``select.epoll`` directly rather than through ``selectors``: at
a slow flow the host wakes once per line of output, and the layer's per-wake Python work (a
key tuple per ready fd, a ready list) was a visible share of the host's CPU per line. An
error or hang-up on an fd runs both of its callbacks (as ``selectors`` reports it: readable
and writable). Timers are the host's own deadlines: it passes the time to the next one to
:meth:`Reactor.poll`.
"""

from __future__ import annotations

import math
import os
import select
import signal

__all__ = ["Reactor", "SignalPipe"]

_IN, _OUT = select.EPOLLIN, select.EPOLLOUT


class Reactor:
    """An epoll with a read and a write callback per fd."""

    def __init__(self) -> None:
        self._ep = select.epoll()
        self._cbs: dict[int, list] = {}  # fd -> [read callback, write callback]
        self._mask: dict[int, int] = {}  # fd -> the events it is registered for

    def _apply(self, fd: int) -> None:
        read_cb, write_cb = self._cbs.get(fd, (None, None))
        events = (_IN if read_cb else 0) | (_OUT if write_cb else 0)
        old = self._mask.get(fd, 0)
        if not events:
            self._cbs.pop(fd, None)
        if events == old:
            return
        if not events:
            del self._mask[fd]
            self._ep.unregister(fd)
            return
        if old:
            self._ep.modify(fd, events)
        else:
            self._ep.register(fd, events)
        self._mask[fd] = events

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
        if self._mask.pop(fd, 0):
            self._ep.unregister(fd)

    def poll(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (None: forever) and run the ready callbacks."""
        # epoll_wait counts milliseconds: round up, so a deadline is never woken for early
        ready = self._ep.poll(-1 if timeout is None else math.ceil(timeout * 1e3) * 1e-3)
        cbs_of = self._cbs
        for fd, mask in ready:
            cbs = cbs_of.get(fd)
            if cbs is None:
                continue
            if mask & ~_OUT and cbs[0]:
                cbs[0]()
            if mask & ~_IN:
                cbs = cbs_of.get(fd)  # the read callback may have dropped it
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
