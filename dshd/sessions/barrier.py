"""Checkpoint barriers: the log is durable through an intent before its side effect starts.

Theory of operation (STORAGE.md intro, EXEC.md §1): a barrier is a ``flush`` that must finish
before something irreversible happens: a tool body (``tool/dispatch``), a step
(``agent/pre-step``) or a model request (``llm/stream``). :func:`checkpoint` is the one
mechanism all of them use:

* it waits until the session log is durable through ``seq`` (group commit: concurrent barriers
  share one fsync);
* it fails closed: a flush that raises becomes :class:`BarrierFailed` with ``STORAGE_FAILURE``
  and a sentence a person can act on, and the caller must not start the side effect;
* cancellation is the caller's: the wait runs in the caller's cancel scope (a call's, a
  turn's). A caller whose scope was cancelled while it waited reports :func:`aborted`
  (``ABORTED_BEFORE_DISPATCH``: nothing started);
* nested dispatch reuses the outer barrier: inside :func:`passed` (the body of a call whose
  barrier already held), a nested ``tool/dispatch`` barrier returns at once.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterator, Protocol

import trio

from ..results import CallFailed, sentence
from ..storage.errors import StorageError

_passed: contextvars.ContextVar[str | None] = contextvars.ContextVar("dsh_barrier", default=None)

KINDS = ("tool/dispatch", "agent/pre-step", "llm/stream")


class DurableLog(Protocol):
    async def wait_durable(self, seq: int) -> None: ...


class BarrierFailed(CallFailed):
    """The side effect must not start. ``code``: STORAGE_FAILURE | ABORTED_BEFORE_DISPATCH."""


def aborted(kind: str) -> BarrierFailed:
    """What a caller reports when its scope was cancelled at (or before) the barrier."""
    what = "the command" if kind == "tool/dispatch" else "the request"
    return BarrierFailed("ABORTED_BEFORE_DISPATCH", sentence("ABORTED_BEFORE_DISPATCH", what=what))


async def checkpoint(log: DurableLog, seq: int, *, kind: str = "tool/dispatch") -> None:
    """Return once ``log`` is durable through ``seq``; raise BarrierFailed otherwise.

    ``kind`` is one of KINDS. Cancellation (of the caller's scope) passes through.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown barrier kind {kind!r}")
    if kind == "tool/dispatch" and _passed.get() is not None:
        return  # nested dispatch: the outer call's barrier already covers us
    try:
        await log.wait_durable(seq)
    except StorageError as exc:
        raise BarrierFailed("STORAGE_FAILURE", sentence("STORAGE_FAILURE", error=exc)) from None
    # An already-durable log returns without a checkpoint: a cancelled caller must still
    # never pass the barrier.
    await trio.lowlevel.checkpoint_if_cancelled()


@contextmanager
def passed(kind: str = "tool/dispatch") -> Iterator[None]:
    """Mark the body that runs behind a barrier (nested dispatch inside reuses it)."""
    token = _passed.set(kind)
    try:
        yield
    finally:
        _passed.reset(token)
