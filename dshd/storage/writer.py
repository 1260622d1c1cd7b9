"""The one write handle of a session log: append, coalesce, group-commit, recover (STORAGE.md §4, §5).

Theory of operation: a `SessionLog` owns the log for its whole life -- through a
`logfile.LogFile`, which holds the file descriptor and the session lock and does the blocking
writes (frames, pwrite + fsync, truncate-back, publishing by ``link``). ``append`` is
synchronous and in memory only: it gives the event the next seq, encodes its line at once (so
a value JSON cannot carry fails the caller, not a later write) and puts it in the buffer.
Nothing is durable until a write has fsynced it:

- **flush()** writes everything buffered as ONE frame (plain: one run of lines) and returns
  the durable seq once ``fsync`` has returned. Writes are serialised by one lock; a flusher
  first notes the seq it needs, and if the write that held the lock already covered it, it
  returns without writing: concurrent flushers share one fsync (group commit).
- **run()** is the coalescing task the owner starts in its nursery: buffered events go out at
  most ``coalesce`` seconds after the *first* of them was appended (later appends do not push
  the deadline). It exits when `aclose` starts.
- **Failure**: a failed write leaves the file as it was (`LogFile` truncates back), the batch
  stays buffered, timed writes pause, and every ``flush()`` retries and raises
  `StorageWriteError` until one succeeds. Callers fail closed. A caller whose change must not
  happen after all (a settings change answered "storage failure") takes its events back with
  `retract` while they are still the unwritten tail.
- **Publishing** (a log made by `create`, which does no I/O): the first write makes the
  directories, takes the session lock and links the log into place (`LogFile.publish`).
- **Opening** (`open_for_write`): the session lock is taken *before* the log is read, through
  the fd that will write it (`logfile.open_log`). A torn tail's kept records are events that
  are not yet durable: the first write truncates the torn bytes, fsyncs, and re-appends them
  as their own frame before the new batch. With ``repair=True`` the crash closers
  (`repair.repair_closers`) are appended and flushed before the handle is returned, and the
  pending-output sidecars of calls whose ``tool/result`` is durable are unlinked.

Progress report: ``write_started`` is the trio time the write in flight (pwrite + fsync, or the
publish) began, None when none is in flight. The service watchdog reads it to tell a writer
that makes progress from one stuck in fsync (``dshd.service``).

Blocking file work runs in a worker thread (`threads.run_sync`: never abandoned on cancel, so a
write in flight always finishes and the in-memory state matches the file). A worker thread that
cannot be started (the user's process limit: a fork bomb elsewhere) is a failed write like any
other: `StorageWriteError` naming the limit, the batch kept, the next flush retries.

One writer per session: across processes the session lock (`lock.HeldLock`, held by the
`LogFile`); inside one process the flocks refuse a second handle too, and the optional
``claims`` set (one per daemon, owned by whoever owns the sessions; no module-level registry)
refuses it before any file is touched. A write under a lost lock (``session.lock`` or the
session directory removed or replaced) does not happen: `StorageWriteError` (cause
`LockLost`) says so, and the log says so once (``storage.lock_lost``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
import os
from pathlib import Path
from typing import Any

import trio
import zstandard

import structlog

from .errors import LockHeld, LockLost, StorageError, StorageWriteError
from .format import (
    COMPRESSIONS,
    LOG_NAME_PLAIN,
    LOG_NAME_ZSTD,
    Event,
    Header,
    encode_line,
    new_event,
    now_ms,
)
from .lock import HeldLock, claim
from .logfile import LogFile, open_log
from .memory import LogMemory, PendingSnapshot
from .pages import iter_all, read_events
from .reader import LogRead, session_dir_for
from .repair import DEFAULT_LIMITS, RepairState, repair_closers, unresolved_calls
from .sidecar import PENDING_DIR, SUFFIX, pending_windows, retire_settled
from .summary import summary_dict, write_summary
from .threads import run_sync

log = structlog.get_logger("dshd.storage")

DEFAULT_COALESCE = 0.200
DEFAULT_SNAPSHOT_EVERY = 10_000
#: Seconds between summary rewrites while durable events are not in it (STORAGE.md §7).
SUMMARY_EVERY = 5.0


class SessionLog:
    """One writer per session (STORAGE.md §4). Build with `create` or `open_for_write`.

    Public state (read-only for callers): ``header`` (`Header`), ``events`` (every event,
    flushed or not, in seq order; recovered and repair events included), ``last_seq`` (-1 when
    empty), ``durable_seq`` (highest seq known fsynced; -1 when none), ``path`` (the log file),
    ``session_dir``, ``compression``, ``coalesce`` (seconds).
    """

    def __init__(self, *, state_dir: Path, session_id: str, header: Header, compression: str,
                 coalesce: float, claims: set[str] | None, read: LogRead | None = None,
                 fd: int | None = None, lock: HeldLock | None = None,
                 snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
                 snapshot_state: Callable[[], dict] | None = None) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        if coalesce < 0:
            raise ValueError("coalesce must be >= 0 seconds")
        if snapshot_every < 0:
            raise ValueError("snapshot_every must be >= 0 events")
        self.state_dir = Path(state_dir)
        self.session_id = session_id
        self.session_dir = session_dir_for(self.state_dir, session_id)
        self.compression = compression
        self.path = self.session_dir / (LOG_NAME_ZSTD if compression == "zstd" else LOG_NAME_PLAIN)
        self.coalesce = coalesce
        self.header = header
        self._claims = claims
        self._lock_lost = False  # a lost lock was logged (once per episode)
        self._file = LogFile(self.session_dir, self.path, compression, fd=fd, lock=lock)

        self._memory = LogMemory(read)
        self.snapshot_every = snapshot_every
        self._snapshot_state = snapshot_state
        self._snapshots_allowed = read is None  # an open allows them once it has returned
        self._compat: list[Event] | None = None  # the deprecated ``events`` (module doc)
        self.last_seq = -1
        self.durable_seq = -1
        self.durable_bytes = 0
        self._published = read is not None
        self._fix: list[tuple[int, bytes]] = []  # torn-tail records to re-append
        if read is not None:
            self.last_seq = read.last_seq
            self.durable_seq = self.last_seq - len(read.recovered)
            self._fix = [(ev.seq, encode_line(ev)) for ev in read.recovered]
            self._file.size = self.durable_bytes = read.valid_bytes
            if read.torn:
                self._file.truncate_to = read.valid_bytes  # cut by the first write
        #: (seq, line or a pending snapshot, trio time appended)
        self._pending: list[tuple[int, bytes | PendingSnapshot, float]] = []
        self._summary_at: float | None = None  # trio time of the last summary write
        self._pending_since: float | None = None

        self._write_lock = trio.Lock()
        #: trio time the write in flight began; None when no write is in flight.
        self.write_started: float | None = None
        self._changed = trio.Event()
        self._failed: BaseException | None = None
        self._runner_active = False
        self._closing = False
        self._closed = False

        self._discarded = False
        self._write_errors = 0
        #: What ``open_for_write(resume=...)`` planned (None without one).
        self.resume_plan: Any = None

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        state_dir: Path,
        session_id: str,
        header: Header,
        *,
        compression: str = "zstd",
        coalesce: float = DEFAULT_COALESCE,
        claims: set[str] | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        snapshot_state: Callable[[], dict] | None = None,
    ) -> SessionLog:
        """A handle for a new session log; no I/O (STORAGE.md §4).

        ``snapshot_every``: events between snapshots (0: never); ``snapshot_state()``: the
        owner's state for a snapshot (no snapshot is written without it; STORAGE.md §7).

        The first write publishes the log (temp ``O_EXCL`` + fsync + ``link`` + directory
        fsync); it fails with `StorageWriteError` if a log already exists or the session lock
        is held. ``compression``: ``"zstd"`` | ``"none"``; ``coalesce``: seconds.
        ``claims``: the owner's set of session ids with a live writer in this process (the
        id is added now, removed by `aclose`). Raises `ValueError` (invalid id, ``header.id``
        differs from ``session_id``, unknown compression), `LockHeld` (id in ``claims``).
        """
        session_dir = session_dir_for(state_dir, session_id)
        if header.id != session_id:
            raise ValueError(f"header.id {header.id!r} differs from session id {session_id!r}")
        with claim(claims, session_dir, session_id):
            return cls(state_dir=state_dir, session_id=session_id, header=header,
                       compression=compression, coalesce=coalesce, claims=claims,
                       snapshot_every=snapshot_every, snapshot_state=snapshot_state)

    @classmethod
    async def open_for_write(
        cls,
        state_dir: Path,
        session_id: str,
        *,
        compression: str | None = None,
        coalesce: float = DEFAULT_COALESCE,
        claims: set[str] | None = None,
        repair: bool = False,
        output_limits: tuple[int, int] | None = None,
        resume: Callable[[list[Event]], Awaitable[Any]] | None = None,
        plan: Callable[[RepairState], Awaitable[Any]] | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        snapshot_state: Callable[[], dict] | None = None,
    ) -> SessionLog:
        """Open an existing session log for writing (STORAGE.md §4, §5).

        Takes ``session.lock`` first (exclusive, non-blocking, identity re-checked), then reads
        the log through the fd it will write. Torn-tail records are kept and re-appended on
        the first write. With ``repair=True`` the crash closers are appended (one shared
        ``time``) and flushed before returning, then sidecars of settled calls are unlinked.
        ``resume(events)``: the daemon's resume plan (``dshd.sessions.resume``), awaited
        before the repair; what its ``keep_calls`` / ``keep_approvals`` / ``keep_turns`` name
        is not closed, its ``windows`` add to the sidecars' (kept as ``self.resume_plan``).
        ``plan(repair_state)`` is the same with the `RepairState` instead of every event
        (``resume`` is deprecated: it makes the handle read the whole log once). The log is
        read from its last snapshot (STORAGE.md §7); ``snapshot_every``/``snapshot_state`` as
        in `create` (no snapshot is taken before this returns).
        ``compression`` is informational: the format on disk wins (a config change applies to
        new sessions only). Raises `ValueError` (invalid id), `FileNotFoundError` (no session
        directory or no log), `LockHeld`, `LogCorrupt`, `LogTooNew`, `StorageWriteError`
        (the repair flush failed; nothing is left open).
        """
        session_dir = session_dir_for(state_dir, session_id)
        with claim(claims, session_dir, session_id):
            read, fd, lock = await run_sync(open_log, session_dir, session_id)
        log = cls(state_dir=state_dir, session_id=session_id, header=read.header,
                  compression=read.compression, coalesce=coalesce, claims=claims, read=read,
                  fd=fd, lock=lock, snapshot_every=snapshot_every,
                  snapshot_state=snapshot_state)
        try:
            if repair:
                await log._repair(output_limits, resume, plan)
            await log._retire_settled_sidecars()
            log._snapshots_allowed = True
        except BaseException:
            with trio.CancelScope(shield=True):
                await log._close_files()
            raise
        return log

    async def _repair(self, limits: tuple[int, int] | None, resume, plan_of) -> None:
        if plan_of is not None:
            plan = await plan_of(self.repair_state)
        else:
            plan = await resume(self.events) if resume is not None else None
        self.resume_plan = plan
        state = self.repair_state
        windows = await run_sync(pending_windows, self.session_dir, unresolved_calls(state))
        if plan is not None:
            windows = {**plan.windows, **windows}  # a checkpointed window wins
        keep = {} if plan is None else {"keep_calls": plan.keep_calls, "keep_turns": plan.keep_turns,
                                        "keep_approvals": plan.keep_approvals}
        at = now_ms()
        for type_, data in repair_closers(state.copy(), windows, limits or DEFAULT_LIMITS, **keep):
            self.append(type_, data, time_ms=at)
        if not self._durable_through(self.last_seq):
            await self.flush()

    async def _retire_settled_sidecars(self) -> None:
        """Unlink the sidecars of calls that are not open (their result is durable)."""
        unsure = {ev.data.get("callId") for ev in self._memory.tail
                  if ev.seq > self.durable_seq and ev.type == "tool/result"}
        open_ = self._memory.repair.calls
        settled = [cid for cid in await run_sync(_sidecar_ids, self.session_dir)
                   if cid not in open_ and cid not in unsure]
        if settled:
            await run_sync(retire_settled, self.session_dir, settled)

    # --- appending and flushing -----------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _durable_through(self, seq: int) -> bool:
        return self._published and seq <= self.durable_seq

    def append(self, type: str, data: dict, *, ignorable: bool = False,
               time_ms: int | None = None) -> Event:
        """Add one event in memory with the next seq and return it (STORAGE.md §3, §4).

        Not durable until a flush (timed by `run`, or `flush`/`wait_durable`). ``time_ms``
        defaults to now (ms since the epoch). ``data`` is encoded now and must not be mutated
        afterwards. Raises `ValueError` (unknown type without ``ignorable``, a string with
        lone surrogates), `TypeError` (``data`` not a dict, or not JSON-encodable), and
        `StorageError` once `aclose` has begun; on any error no seq is consumed.
        """
        if self._closing or self._closed:
            raise StorageError(f"session {self.session_id}: the log is closed")
        event, line = new_event(self.last_seq + 1, type, data, ignorable=ignorable,
                                time_ms=now_ms() if time_ms is None else time_ms)
        now = trio.current_time()
        self._memory.see(event)
        if self._compat is not None:
            self._compat.append(event)
        self.last_seq = event.seq
        self._pending.append((event.seq, line, now))
        if self._pending_since is None:
            self._pending_since = now
            self._notify()
        return event

    def retract(self, first: int, last: int) -> bool:
        """Take back the events ``first..last`` if nobody can have seen them durable.

        Only the unwritten tail can be taken back: ``last`` must be the last seq appended, every
        event from ``first`` must still be buffered (never written), and no write may be in
        flight. Then they are removed (their seqs are free again) and True is returned; else
        nothing changes and False is returned (the caller appends a compensating event). Used
        when a durable change failed and must change nothing (STORAGE.md §4).
        """
        if last != self.last_seq or first > last or first <= self.durable_seq:
            return False
        if self._write_lock.locked() or self._fix and self._fix[-1][0] >= first:
            return False
        count = last - first + 1
        if len(self._pending) < count or self._pending[-count][0] != first:
            return False
        if any(isinstance(line, PendingSnapshot) for _, line, _ in self._pending[-count:]):
            return False
        del self._pending[-count:]
        self._memory.retract(first)
        if self._compat is not None:
            del self._compat[-count:]
        self.last_seq = first - 1
        self._pending_since = self._pending[0][2] if self._pending else None
        if not self._pending and not self._fix:
            self._failed = None  # nothing is left to retry: timed writes may resume
        self._notify()
        return True

    async def flush(self) -> int:
        """Make every event appended so far durable; return the durable seq (STORAGE.md §4).

        Writes the buffer as one frame and returns once fsync returned. Concurrent callers
        share one write (group commit). Raises `StorageWriteError` when the write fails (the
        batch stays buffered, timed writes pause; the next flush retries), `StorageError` when
        the handle is closed.
        """
        if self._closed:
            raise StorageError(f"session {self.session_id}: the log is closed")
        target = self.last_seq
        async with self._write_lock:
            if self._durable_through(target):
                return self.durable_seq
            if self._closed:
                raise StorageError(f"session {self.session_id}: the log is closed")
            await self._write_locked()
        return self.durable_seq

    async def wait_durable(self, seq: int, *, flush: bool = True) -> None:
        """Return once event ``seq`` is durable.

        ``flush=True`` (default) flushes now if needed (a checkpoint barrier). ``flush=False``
        waits for the timed write of `run` instead (which must be running). Raises
        `ValueError` for a seq never appended, `StorageWriteError` (a write failed; with
        ``flush=False`` as soon as timed writes are paused), `StorageError` (closed).
        """
        if seq > self.last_seq:
            raise ValueError(f"seq {seq} was never appended (last is {self.last_seq})")
        if flush:
            if not self._durable_through(seq):
                await self.flush()
            return
        while not self._durable_through(seq):
            if self._failed is not None:
                raise StorageWriteError(
                    f"session {self.session_id}: timed writes are paused after a failed write"
                ) from self._failed
            if self._closed:
                raise StorageError(f"session {self.session_id}: the log is closed")
            await self._changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The coalescing task: flush buffered events ``coalesce`` s after the first of them.

        Start it in the owner's nursery (``await nursery.start(log.run)``); it returns when
        `aclose` begins. A failed timed write is not raised here: it pauses timed writes and
        the next `flush` reports it.
        """
        if self._runner_active:
            raise RuntimeError("SessionLog.run is already running")
        self._runner_active = True
        try:
            task_status.started()
            while not self._closing:
                changed = self._changed
                since = self._pending_since
                if since is None or self._failed is not None:
                    await changed.wait()
                    continue
                deadline = since + self.coalesce
                if trio.current_time() < deadline:
                    with trio.move_on_at(deadline):
                        await changed.wait()
                    continue
                try:
                    await self.flush()
                except StorageError:
                    pass  # paused (or closed); flush() callers get the error
        finally:
            self._runner_active = False

    def _maybe_snapshot(self, force: bool = False) -> None:
        """Append a snapshot as the next seq when one is due (STORAGE.md §7)."""
        memory = self._memory
        if (self._snapshot_state is None or not self._snapshots_allowed
                or self.snapshot_every == 0 or self.last_seq <= memory.last_snapshot_seq):
            return
        if not (force or memory.due(self.last_seq, self.snapshot_every)):
            return
        try:
            session = self._snapshot_state()
            if not isinstance(session, dict):
                raise TypeError(f"snapshot_state() returned {type(session).__name__}")
        except Exception as e:  # the owner's bug: no snapshot, the log goes on
            log.error("storage.snapshot_state_failed", session=self.session_id, error=repr(e))
            return
        snap = memory.take_snapshot(self.last_seq + 1, now_ms(), session)
        self.last_seq = snap.seq
        self._pending.append((snap.seq, snap, trio.current_time()))
        if self._compat is not None:
            self._compat.append(snap.event(-1))

    def _payloads(self, pending: list, fix: list) -> list:
        payloads: list = []
        if not self._published:
            payloads.append(encode_line(self.header))
        if fix:
            payloads.append(b"".join(line for _, line in fix))
        run: list[bytes] = []
        for _, line, _ in pending:
            if isinstance(line, PendingSnapshot):  # its own frame
                if run:
                    payloads.append(b"".join(run))
                    run = []
                payloads.append(line.payload)
            else:
                run.append(line)
        if run:
            payloads.append(b"".join(run))
        return payloads

    async def _write_locked(self, *, closing: bool = False) -> None:
        self._maybe_snapshot(force=closing)
        pending = list(self._pending)
        fix = list(self._fix)
        settings = self._memory.settings  # through the last event of this write
        payloads = self._payloads(pending, fix)
        self.write_started = trio.current_time()
        try:
            if self._published:
                await run_sync(self._file.append, payloads)
            else:
                await run_sync(self._file.publish, payloads)
        except (OSError, LockHeld, LockLost, zstandard.ZstdError) as e:
            self._failed = e
            self._write_errors += 1
            self._notify()
            if isinstance(e, LockLost) and not self._lock_lost:
                self._lock_lost = True
                log.error("storage.lock_lost", session=self.session_id, path=str(e.path),
                          reason=e.reason, buffered=len(self._pending) + len(self._fix))
            raise StorageWriteError(
                f"session {self.session_id}: writing {self.path} failed ({e}); "
                f"{len(self._pending) + len(self._fix)} events stay buffered and the next "
                "flush retries"
            ) from e
        finally:
            self.write_started = None
        self._published = True
        self._fix.clear()
        del self._pending[: len(pending)]
        if pending:
            self.durable_seq = pending[-1][0]
        elif fix:
            self.durable_seq = fix[-1][0]
        self.durable_bytes = self._file.size
        snapped = [line for _, line, _ in pending if isinstance(line, PendingSnapshot)]
        for snap in snapped:
            self._memory.snapshot_durable(snap)
        self._pending_since = self._pending[0][2] if self._pending else None
        self._failed = None
        self._lock_lost = False
        self._notify()
        if snapped or closing or self._summary_due():
            await self._write_summary(settings)

    def _summary_due(self) -> bool:
        return self._summary_at is None or trio.current_time() - self._summary_at >= SUMMARY_EVERY

    async def _write_summary(self, settings: dict) -> None:
        """Rewrite summary.json for what is durable (derived: a failure is only logged)."""
        self._summary_at = trio.current_time()
        summary = summary_dict(self.header, settings, self.durable_seq, self.durable_bytes,
                               self._memory.snapshot_offset)
        try:
            await run_sync(write_summary, self.session_dir, summary)
        except OSError as e:
            log.warning("storage.summary_failed", session=self.session_id, error=str(e))

    # --- closing --------------------------------------------------------------------------

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
            elif self._published and self._failed is None:
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

    # --- introspection --------------------------------------------------------------------

    @property
    def tail(self) -> list[Event]:
        """The events after the last durable snapshot (durable or not; snapshots excluded)."""
        return self._memory.tail

    @property
    def repair_state(self) -> RepairState:
        """The crash-repair fold through `last_seq` (read-only: copy it to change it)."""
        return self._memory.repair

    @property
    def settings(self) -> dict:
        """``approvalPolicy``/``sandbox``/``owner`` as logged through `last_seq` (None: never)."""
        return self._memory.settings

    @property
    def snapshot(self) -> dict | None:
        """The owner's dict of the last durable snapshot (None: none yet)."""
        return self._memory.snapshot

    @property
    def snapshot_seq(self) -> int:
        return self._memory.snapshot_seq

    @property
    def snapshot_offset(self) -> int | None:
        return self._memory.snapshot_offset

    def set_snapshot_state(self, snapshot_state: Callable[[], dict] | None) -> None:
        """Give (or take back) the owner's snapshot callback (STORAGE.md §7)."""
        self._snapshot_state = snapshot_state

    def read_events(self, after_seq: int, limit: int) -> list[Event]:
        """Durable events with seq > ``after_seq`` from disk, verified (`pages.read_events`);
        sync: run it in a worker thread. The non-durable tail is in `tail`."""
        return read_events(self.session_dir, self.session_id, after_seq, limit,
                           snapshot_offset=self._memory.snapshot_offset,
                           end=self.durable_bytes)

    @property
    def events(self) -> list[Event]:
        """DEPRECATED (room sessions moves to `tail`/`read_events`/`repair_state`): every
        event, read from disk once on first use and kept appended from then on."""
        if self._compat is None:
            first = self._memory.tail[0].seq if self._memory.tail else self.last_seq + 1
            disk: list[Event] = []
            if self._published and first > 0:
                disk = [ev for ev in iter_all(self.session_dir, self.session_id)
                        if ev.seq < first]
            self._compat = disk + list(self._memory.tail)
            if len(self._compat) != self.last_seq + 1:  # a pending snapshot at the end
                self._compat += [p.event(-1) for _, p, _ in self._pending
                                 if isinstance(p, PendingSnapshot)]
        return self._compat

    def statistics(self) -> dict:
        """Counters and state: ``last_seq``, ``durable_seq``, ``buffered`` (events not yet
        durable), ``fsyncs`` (file and directory fsyncs issued), ``frames`` (frames written),
        ``writes`` (write attempts), ``write_errors``, ``failed`` (str of the last unrecovered
        error or None), ``bytes`` (known-good file size), ``published``, ``closed``."""
        return {
            "session_id": self.session_id,
            "compression": self.compression,
            "last_seq": self.last_seq,
            "durable_seq": self.durable_seq,
            "buffered": len(self._pending) + len(self._fix),
            "fsyncs": self._file.fsyncs,
            "frames": self._file.frames,
            "writes": self._file.writes,
            "write_errors": self._write_errors,
            "failed": None if self._failed is None else str(self._failed),
            "bytes": self._file.size,
            "published": self._published,
            "closed": self._closed,
        }


def _sidecar_ids(session_dir: Path) -> list[str]:
    try:
        names = os.listdir(session_dir / PENDING_DIR)
    except OSError:
        return []
    return [n[: -len(SUFFIX)] for n in names if n.endswith(SUFFIX)]
