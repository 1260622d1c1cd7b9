"""Checkpoint barriers: the log is durable through an intent before its side effect starts.

Theory of operation (STORAGE.md intro, EXEC.md §1): a barrier is a ``flush`` that must finish
before something irreversible happens: a tool body (``tool/dispatch``), a step
(``agent/pre-step``) or a model request (``llm/stream``). :func:`checkpoint` is the one
mechanism all of them use:

* it waits until the session log is durable through ``seq`` (group commit: concurrent barriers
  share one fsync);
* it fails closed: a flush that raises becomes :class:`BarrierFailed` with ``STORAGE_FAILURE``
  and a sentence a person can act on, and the caller must not start the side effect;
* cancellation while waiting (``cancel`` set, or the caller's scope cancelled) becomes
  ``ABORTED_BEFORE_DISPATCH``: nothing started;
* nested dispatch reuses the outer barrier: inside :func:`passed` (the body of a call whose
  barrier already held), a nested ``tool/dispatch`` barrier returns at once.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterator, Protocol

import trio

from .results import sentence
from .storage.errors import StorageError

_passed: contextvars.ContextVar[str | None] = contextvars.ContextVar("dsh_barrier", default=None)

KINDS = ("tool/dispatch", "agent/pre-step", "llm/stream")


class DurableLog(Protocol):
    async def wait_durable(self, seq: int) -> None: ...


class BarrierFailed(Exception):
    """The side effect must not start. ``code``: STORAGE_FAILURE | ABORTED_BEFORE_DISPATCH."""

    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(sentence)
        self.code = code
        self.sentence = sentence


def _aborted(kind: str) -> BarrierFailed:
    what = "the command" if kind == "tool/dispatch" else "the request"
    return BarrierFailed("ABORTED_BEFORE_DISPATCH", sentence("ABORTED_BEFORE_DISPATCH", what=what))


async def checkpoint(
    log: DurableLog, seq: int, *, kind: str = "tool/dispatch", cancel: trio.Event | None = None
) -> None:
    """Return once ``log`` is durable through ``seq``; raise BarrierFailed otherwise.

    ``kind`` is one of KINDS. ``cancel``: an event that aborts the wait when set.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown barrier kind {kind!r}")
    if kind == "tool/dispatch" and _passed.get() is not None:
        return  # nested dispatch: the outer call's barrier already covers us
    if cancel is not None and cancel.is_set():
        raise _aborted(kind)
    failure: StorageError | None = None
    async with trio.open_nursery() as nursery:
        if cancel is not None:

            async def watch() -> None:
                await cancel.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
        try:
            await log.wait_durable(seq)
        except StorageError as exc:  # caught inside: a nursery would wrap it in a group
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise BarrierFailed("STORAGE_FAILURE", sentence("STORAGE_FAILURE", error=failure))
    if cancel is not None and cancel.is_set():
        raise _aborted(kind)


@contextmanager
def passed(kind: str = "tool/dispatch") -> Iterator[None]:
    """Mark the body that runs behind a barrier (nested dispatch inside reuses it)."""
    token = _passed.set(kind)
    try:
        yield
    finally:
        _passed.reset(token)
