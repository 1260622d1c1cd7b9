"""The local terminal under ``dsh run -t`` and ``dsh attach`` of a tty call (named
``localterm``: ``tty`` is the stdlib module it uses).

Theory of operation: ``raw_terminal(fd)`` puts the terminal in raw mode (``tty.setraw``: no
echo, no line editing, no signals from keys -- Ctrl-C is a byte that goes to the command, no
output processing -- the remote PTY already turns ``\\n`` into ``\\r\\n``) for the duration of
the block and restores the saved attributes on every way out: a return, an exception, a
cancellation, a signal dsh handles (SIGTERM and SIGHUP detach, so they unwind through here).
``terminal_size`` is the (cols, rows) of the first of stdin and stdout that is a terminal,
else ``$COLUMNS``/``$LINES``, else 80x24, each clamped to the daemon's 1..10000. ``read_input``
reads what is there on an fd without blocking the event loop: a pipe, socket or terminal is
waited on (``anyio.wait_readable``), a regular file or another device is read at once (epoll
refuses them, and they never block). Neither touches O_NONBLOCK: the fd is shared with the
shell that started dsh.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import termios
import tty
from typing import Iterator

import anyio

__all__ = ["raw_terminal", "terminal_size", "read_input", "isatty", "stdin_usable",
           "write_line", "MIN_SIZE", "MAX_SIZE"]

MIN_SIZE, MAX_SIZE = 1, 10000
DEFAULT_SIZE = (80, 24)


def isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def stdin_usable(fd: int = 0) -> bool:
    """Whether ``fd`` is open (a closed stdin forwards nothing). For fd 0 Python's own view
    counts too: a stdin closed when the interpreter started is ``sys.stdin is None``, and its
    number may belong to another file since (``client.cli.main.hold_standard_fds`` prevents
    that for ``dsh`` itself)."""
    if fd == 0 and sys.stdin is None:
        return False
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _clamp(value: int) -> int:
    return max(MIN_SIZE, min(MAX_SIZE, value))


def terminal_size() -> tuple[int, int]:
    for fd in (0, 1, 2):
        if isatty(fd):
            try:
                size = os.get_terminal_size(fd)
            except OSError:
                continue
            if size.columns > 0 and size.lines > 0:
                return _clamp(size.columns), _clamp(size.lines)
    try:
        return _clamp(int(os.environ["COLUMNS"])), _clamp(int(os.environ["LINES"]))
    except (KeyError, ValueError):
        return DEFAULT_SIZE


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """Raw mode on terminal ``fd`` inside the block; the saved mode restored on leaving it."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _waitable(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or isatty(fd)


async def read_input(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd``, b"" at its end (module doc)."""
    if _waitable(fd):
        await anyio.wait_readable(fd)
    else:
        await anyio.sleep(0)  # a regular file: never blocks, but let the others run
    try:
        return os.read(fd, limit)
    except BlockingIOError:
        return await read_input(fd, limit)
    except OSError as exc:
        if exc.errno == 5:  # EIO: the terminal went away (hang-up)
            return b""
        raise


def write_line(text: str) -> None:
    """One line on stderr that reads right in raw mode too (``\\r\\n``)."""
    sys.stderr.write(text.rstrip("\n") + "\r\n")
    sys.stderr.flush()
