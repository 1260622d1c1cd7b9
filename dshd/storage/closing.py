"""Closing a session log's write handle: the final write, giving up an unpublished log (STORAGE.md §4, §7).

Theory of operation: `ClosingMixin` is the closing half of `writer.SessionLog` (it uses the
handle's state directly). `aclose` flushes what is buffered -- with a snapshot when events
were written since the last one, and the summary -- shielded and bounded by a timeout, then
closes the file and releases the lock; `discard_unpublished` gives up a log whose first write
never happened.
"""

from __future__ import annotations

import trio

from .errors import StorageError, StorageWriteError


class ClosingMixin:
    """The closing methods of `writer.SessionLog` (module doc)."""

    async def _close_files(self) -> None:
        async with self._write_lock:  # a write in flight finishes before its fd closes
            try:
                self._file.close(remove_unpublished_dir=self._discarded)
            finally:
                if self._claims is not None:
                    self._claims.discard(self.session_id)
                self._closed = True
                self._closing = True
                self._notify()

    async def _final_write(self) -> None:
        """The close's write: what is buffered, a snapshot when events were written since the
        last one, and the summary (STORAGE.md §4, §7)."""
        if self._discarded:
            return
        memory = self._memory
        async with self._write_lock:
            snapshot = (self._published and self._snapshot_state is not None
                        and self._snapshots_allowed and self.snapshot_every > 0
                        and self.last_seq > memory.last_snapshot_seq)
            if self._pending or self._fix or snapshot:
                await self._write_locked(closing=True)
            elif self._published and self._failed is None and self._summary_seq != self.durable_seq:
                await self._write_summary(memory.settings)

    def discard_unpublished(self) -> bool:
        """Give up a log whose first durable write never happened (STORAGE.md §4).

        `create` does no I/O, so until the log is published nobody was promised anything:
        when the first flush failed (the caller answered "storage failure"), the owner calls
        this so that `aclose` writes nothing and the session does not appear later. Returns
        True when the log was unpublished: its buffer is dropped, further appends raise
        `StorageError`, and `aclose` writes nothing; it releases the lock and removes the
        session directory if this handle made it. Returns False, changing nothing, when the
        log is published (its events are someone's truth: they stay).
        """
        if self._published:
            return False
        self._discarded = True
        self._pending.clear()
        self._fix.clear()
        self._pending_since = None
        self._closing = True
        self._notify()
        return True

    async def aclose(self, *, timeout: float = 30.0) -> None:
        """Final flush, then release the lock and close the file (idempotent).

        The flush runs shielded, bounded by ``timeout`` seconds; its error
        (`StorageWriteError`) is raised after everything is closed: events still buffered
        then are lost, and the caller is told. The `run` task returns.
        """
        if self._closed:
            return
        self._closing = True
        self._notify()
        error: BaseException | None = None
        with trio.CancelScope(shield=True):
            try:
                with trio.move_on_after(timeout) as scope:
                    await self._final_write()
                if scope.cancelled_caught:
                    error = StorageWriteError(
                        f"session {self.session_id}: the final flush did not finish in {timeout} s"
                    )
            except StorageError as e:
                error = e
            finally:
                await self._close_files()
        if error is not None:
            raise error
