"""The one write handle of a session log: append, coalesce, group-commit, snapshot, recover (STORAGE.md §4, §5, §7).

Theory of operation: a `SessionLog` owns the log for its whole life -- through a
`logfile.LogFile`, which holds the fd and the session lock and does the blocking writes
(frames, pwrite + fsync, truncate-back, publishing by ``link``). ``append`` is synchronous and
in memory only: it gives the event the next seq, encodes its line at once (a value JSON cannot
carry fails the caller, not a later write), folds it (`memory.LogMemory`: the tail since the
last snapshot, the repair and settings folds) and buffers it. Nothing is durable until a
write has fsynced it:

- **flush()** writes everything buffered as ONE frame (plain: one run of lines) -- plus, when
  ``snapshot_every`` events have passed since the last snapshot and the owner gave
  ``snapshot_state``, a ``log/snapshot`` in a frame of its own after it, in the same append --
  and returns the durable seq once ``fsync`` has returned. Writes are serialised by one lock;
  a flusher whose seq the write holding the lock already covered returns without writing
  (group commit). Once a snapshot is durable the events before it leave memory. The same
  worker-thread call rewrites ``summary.json`` after a snapshot, at close, and at most every
  `SUMMARY_EVERY` seconds (`summary.py`).
- **run()** is the coalescing task: buffered events go out at most ``coalesce`` seconds after
  the *first* of them (later appends do not push the deadline). It exits when `aclose` starts.
- **Failure**: a failed write leaves the file as it was (`LogFile` truncates back), the batch
  stays buffered, timed writes pause, and every ``flush()`` retries and raises
  `StorageWriteError` until one succeeds. Callers fail closed; a change that must not happen
  after all is taken back with `retract` while it is the unwritten tail.
- **Publishing** (a log made by `create`, which does no I/O): the first write makes the
  directories, takes the session lock and links the log into place (`LogFile.publish`).
- **Opening** (`open_for_write`): the session lock is taken *before* the log is read, through
  the fd that will write it, from the last snapshot on (`logfile.open_log`, `pages.py`). A
  torn tail's kept records are not yet durable: the first write truncates the torn bytes,
  fsyncs, and re-appends them. With ``repair=True`` the resume plan and the crash closers run
  (`opening.py`); closing is `closing.py`.

``write_started`` is the trio time the write in flight began (None: none); the service
watchdog reads it to tell a writer that makes progress from one stuck in fsync. Blocking file
work runs in a worker thread (`threads.run_sync`: never abandoned on cancel); a thread that
cannot be started (the user's process limit) is a failed write like any other.

One writer per session: across processes the session lock (`lock.HeldLock`, held by the
`LogFile`); inside one process the flocks, and the optional ``claims`` set (one per daemon,
owned by whoever owns the sessions), refuse a second handle before any file is touched. A
write under a lost lock (``session.lock`` or the directory removed or replaced) does not
happen: `StorageWriteError` (cause `LockLost`), logged once (``storage.lock_lost``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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
from .closing import ClosingMixin
from .lock import HeldLock, claim
from .logfile import LogFile, open_log
from .memory import LogMemory, MemoryViews, PendingSnapshot, payloads_of
from .opening import compat_events, repair_on_open, retire_settled_sidecars
from .pages import read_events
from .reader import LogRead, session_dir_for
from .repair import RepairState
from .summary import summarising, summary_dict, write_summary
from .threads import run_sync

log = structlog.get_logger("dshd.storage")

DEFAULT_COALESCE = 0.200
DEFAULT_SNAPSHOT_EVERY = 10_000
#: Seconds between summary rewrites while durable events are not in it (STORAGE.md §7).
SUMMARY_EVERY = 5.0


class SessionLog(ClosingMixin, MemoryViews):
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
        self._summary_seq = self.durable_seq if read is None else None  # the seq it covers
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
                await repair_on_open(log, output_limits, resume, plan)
            await retire_settled_sidecars(log)
            log._snapshots_allowed = True
        except BaseException:
            with trio.CancelScope(shield=True):
                await log._close_files()
            raise
        return log

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
        if not self._snapshots_allowed:
            return
        snap = self._memory.maybe_snapshot(self.last_seq, self.snapshot_every, force,
                                           self._snapshot_state, self.session_id)
        if snap is not None:
            self.last_seq = snap.seq
            self._pending.append((snap.seq, snap, trio.current_time()))
            if self._compat is not None:
                self._compat.append(snap.event(-1))

    async def _write_locked(self, *, closing: bool = False) -> None:
        self._maybe_snapshot(force=closing)
        pending = list(self._pending)
        fix = list(self._fix)
        payloads = payloads_of(None if self._published else encode_line(self.header),
                               pending, fix)
        snapped = [line for _, line, _ in pending if isinstance(line, PendingSnapshot)]
        last = pending[-1][0] if pending else fix[-1][0] if fix else self.durable_seq
        summary = (self._summary_of(self._memory.settings, last, snapped)
                   if snapped or closing or self._summary_due() else None)
        write = self._file.append if self._published else self._file.publish
        self.write_started = trio.current_time()
        try:
            summary_error = await run_sync(summarising(write, summary), payloads)
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
        for snap in snapped:
            self._memory.snapshot_durable(snap)
        self._pending_since = self._pending[0][2] if self._pending else None
        self._failed = None
        self._lock_lost = False
        if summary is not None:
            self._summary_at, self._summary_seq = trio.current_time(), self.durable_seq
            if summary_error is not None:
                log.warning("storage.summary_failed", session=self.session_id,
                            error=str(summary_error))
        self._notify()

    def _summary_of(self, settings: dict, last_seq: int, snapped: list) -> Callable[[int], dict]:
        """The summary of this write, given the file size after it (written in its thread)."""
        header, before, activity = self.header, self._memory.snapshot_offset, self.activity

        def summary(size: int) -> dict:
            offset = snapped[-1].offset if snapped else before
            return summary_dict(header, settings, last_seq, size, offset, activity)
        return summary

    def _summary_due(self) -> bool:
        return self._summary_at is None or trio.current_time() - self._summary_at >= SUMMARY_EVERY

    async def _write_summary(self, settings: dict) -> None:
        """Rewrite summary.json for what is durable (derived: a failure is only logged)."""
        self._summary_at, self._summary_seq = trio.current_time(), self.durable_seq
        summary = summary_dict(self.header, settings, self.durable_seq, self.durable_bytes,
                               self._memory.snapshot_offset, self.activity)
        try:
            await run_sync(write_summary, self.session_dir, summary)
        except OSError as e:
            log.warning("storage.summary_failed", session=self.session_id, error=str(e))

    # --- introspection --------------------------------------------------------------------

    def set_snapshot_state(self, snapshot_state: Callable[[], dict] | None) -> None:
        """Give (or take back) the owner's snapshot callback (STORAGE.md §7)."""
        self._snapshot_state = snapshot_state

    def read_events(self, after_seq: int, limit: int) -> list[Event]:
        """Durable events with seq > ``after_seq`` from disk, verified (`pages.read_events`);
        sync: run it in a worker thread. The non-durable tail is in `tail`."""
        return read_events(self.session_dir, self.session_id, after_seq, limit,
                           snapshot_offset=self.snapshot_offset, end=self.durable_bytes)

    @property
    def events(self) -> list[Event]:
        """DEPRECATED (room sessions moves to `tail`/`read_events`/`repair_state`): every
        event, read from disk once on first use and kept appended from then on."""
        if self._compat is None:
            self._compat = compat_events(self)
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


