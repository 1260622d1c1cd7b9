"""Blocking storage work in a worker thread, with thread exhaustion as a storage failure.

Theory of operation: every blocking file operation of the storage room (and of the session's
sidecar retirement) runs through :func:`run_sync`, a thin wrapper of
``trio.to_thread.run_sync``. Starting a worker thread can fail when the daemon's user has
reached its process/thread limit (``RLIMIT_NPROC``, a cgroup's ``pids.max``: a fork bomb in
one session's tool is enough): Python raises ``RuntimeError("can't start new thread")`` before
the function ran. That is not a bug of the caller but a resource limit, so it becomes
:class:`ThreadsExhausted`, an ``OSError`` (``EAGAIN``) whose message names the limit: callers
that already fail closed on ``OSError`` (the writer keeps its batch and retries on the next
flush, STORAGE.md §4) handle it like a failed write. A ``RuntimeError`` raised by the function
itself, inside the thread, passes through unchanged.
"""

from __future__ import annotations

import errno
from typing import Callable, TypeVar

import trio

T = TypeVar("T")


class ThreadsExhausted(OSError):
    """A worker thread could not be started; nothing of the blocking work ran."""


def exhausted(cause: BaseException) -> ThreadsExhausted:
    return ThreadsExhausted(
        errno.EAGAIN,
        f"dshd could not start a worker thread ({cause}): its user has reached the process/"
        "thread limit (RLIMIT_NPROC, or the cgroup's pids.max; a tool that forks without end "
        "does this); nothing was written, and the next flush retries once processes exit",
    )


async def run_sync(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a worker thread (never abandoned on cancel); see the module doc."""
    started = False

    def work() -> T:
        nonlocal started
        started = True
        return fn(*args)

    try:
        return await trio.to_thread.run_sync(
            work, thread_name=f"dshd storage {getattr(fn, '__name__', 'work')}"
        )
    except RuntimeError as exc:
        if started:
            raise
        raise exhausted(exc) from exc
