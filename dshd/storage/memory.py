"""What a session log's writer keeps in memory: the tail since the last snapshot and the folds (STORAGE.md §7).

Theory of operation: `LogMemory` is the writer's bounded picture of its log. It holds the
events after the last *durable* snapshot (``tail``: durable or not, snapshots themselves
excluded), the crash-repair fold (`repair.RepairState`), the settings fold
(`snapshot.fold_settings`) and the activity (`snapshot.activity_of`) through the last event
appended, and the last durable snapshot
(its seq, offset, owner dict, and the folds it carries: the base a retract refolds from).

`take_snapshot` prepares a snapshot as the next seq: its data is complete but for its own
offset (``verifiedThrough``), which only the write knows, so its payload is a callable of
that offset (`logfile.LogFile._frames_of`). Once the write is durable, `snapshot_durable`
makes it the base and drops the events before it. Pure bookkeeping: no I/O, no trio.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from .format import Event, encode_line, now_ms
from .reader import LogRead
from .repair import RepairState
from .snapshot import (EMPTY_SETTINGS, SNAPSHOT_IGNORABLE, SNAPSHOT_TYPE, activity_of,
                       base_activity, fold_settings, snapshot_settings)

log = structlog.get_logger("dshd.storage")


class PendingSnapshot:
    """A snapshot appended but not yet written: ``payload(offset)`` gives its line."""

    def __init__(self, seq: int, time_ms: int, prev: int | None, repair: dict, settings: dict,
                 session: dict) -> None:
        self.seq, self.time_ms, self.prev = seq, time_ms, prev
        self.repair, self.settings, self.session = repair, settings, session
        self.offset: int | None = None

    def event(self, offset: int) -> Event:
        data = {"through": self.seq - 1, "verifiedThrough": offset, "prev": self.prev,
                "repair": self.repair, "settings": dict(self.settings), "session": self.session}
        return Event(seq=self.seq, time=self.time_ms, type=SNAPSHOT_TYPE, data=data,
                     ignorable=SNAPSHOT_IGNORABLE)

    def payload(self, offset: int) -> bytes:
        self.offset = offset
        return encode_line(self.event(offset))


class LogMemory:
    """The bounded in-memory state of one log (module doc)."""

    def __init__(self, read: LogRead | None = None) -> None:
        self.tail: list[Event] = []
        self.repair = RepairState()
        self.settings: dict = dict(EMPTY_SETTINGS)
        self.snapshot: dict | None = None  # the owner's dict of the last durable snapshot
        self.snapshot_seq = -1
        self.snapshot_offset: int | None = None
        self.last_snapshot_seq = -1  # durable or pending
        self._base_repair: dict = RepairState().to_json()
        self._base_settings: dict = dict(EMPTY_SETTINGS)
        if read is not None and read.repair is not None:
            self.tail = list(read.events)
            self.repair, self.settings = read.repair, dict(read.settings or EMPTY_SETTINGS)
            if read.snapshot is not None:
                snap = read.snapshot
                self.snapshot = snap.data.get("session")
                self.snapshot_seq = self.last_snapshot_seq = snap.seq
                self.snapshot_offset = read.snapshot_offset
                self._base_repair = snap.data["repair"]
                self._base_settings = snapshot_settings(snap.data)
            else:
                self._refold_base_from_empty()
        elif read is not None:  # a read without folds (never from open_log): fold it now
            self.tail = list(read.events)
            self.repair.see_all(self.tail)
            for ev in self.tail:
                self.settings = fold_settings(self.settings, ev)
        #: ``updatedAt``/``lastExit`` through the last event (`snapshot.activity_of`).
        self.activity = activity_of(base_activity(self.snapshot), self.tail)

    def _refold_base_from_empty(self) -> None:
        self._base_repair, self._base_settings = RepairState().to_json(), dict(EMPTY_SETTINGS)

    def see(self, ev: Event) -> None:
        """An event appended (never a snapshot)."""
        self.tail.append(ev)
        self.repair.see(ev)
        self.settings = fold_settings(self.settings, ev)
        self.activity = activity_of(self.activity, [ev])

    def retract(self, first: int) -> None:
        """Forget the events from seq ``first`` on and refold from the base snapshot."""
        self.tail = [ev for ev in self.tail if ev.seq < first]
        self.repair = RepairState.from_json(self._base_repair).see_all(self.tail)
        settings = dict(self._base_settings)
        for ev in self.tail:
            settings = fold_settings(settings, ev)
        self.settings = settings
        self.activity = activity_of(base_activity(self.snapshot), self.tail)

    def due(self, last_seq: int, every: int) -> bool:
        return every > 0 and last_seq - self.last_snapshot_seq >= every

    def take_snapshot(self, seq: int, time_ms: int, session: dict) -> PendingSnapshot:
        """A snapshot at ``seq`` folding everything before it (module doc)."""
        prev = self.snapshot_offset
        snap = PendingSnapshot(seq, time_ms, prev, self.repair.to_json(), dict(self.settings),
                               session)
        self.last_snapshot_seq = seq
        return snap

    def maybe_snapshot(self, last_seq: int, every: int, force: bool, state, session_id: str
                       ) -> PendingSnapshot | None:
        """The snapshot to append as seq ``last_seq + 1`` when one is due (``force``: at a
        clean close, when events came since the last one), asking ``state()`` for the owner's
        dict; None when none is due, there is no ``state``, or it fails (logged)."""
        if state is None or every == 0 or last_seq <= self.last_snapshot_seq:
            return None
        if not (force or self.due(last_seq, every)):
            return None
        try:
            session = state()
            if not isinstance(session, dict):
                raise TypeError(f"snapshot_state() returned {type(session).__name__}")
        except Exception as e:  # the owner's bug: no snapshot, the log goes on
            log.error("storage.snapshot_state_failed", session=session_id, error=repr(e))
            return None
        return self.take_snapshot(last_seq + 1, now_ms(), session)

    def snapshot_durable(self, snap: PendingSnapshot) -> None:
        """``snap`` is durable at ``snap.offset``: it becomes the base; older events go."""
        self.snapshot, self.snapshot_seq = snap.session, snap.seq
        self.snapshot_offset = snap.offset
        self._base_repair, self._base_settings = snap.repair, dict(snap.settings)
        self.tail = [ev for ev in self.tail if ev.seq > snap.seq]


SnapshotState = Callable[[], dict]


def payloads_of(header_line: bytes | None, pending: list, fix: list) -> list:
    """The frames of one write: the header (first write), the torn-tail records, then the
    buffered lines, each snapshot in a frame of its own (a callable of its offset)."""
    payloads: list = [] if header_line is None else [header_line]
    if fix:
        payloads.append(b"".join(line for _, line in fix))
    run: list[bytes] = []
    for _, line, _ in pending:
        if isinstance(line, PendingSnapshot):
            if run:
                payloads.append(b"".join(run))
                run = []
            payloads.append(line.payload)
        else:
            run.append(line)
    if run:
        payloads.append(b"".join(run))
    return payloads


class MemoryViews:
    """The read-only views `writer.SessionLog` gives of its `LogMemory` (``self._memory``)."""

    _memory: LogMemory

    @property
    def tail(self) -> list[Event]:
        """The events after the last durable snapshot (durable or not; snapshots excluded)."""
        return self._memory.tail

    @property
    def repair_state(self) -> RepairState:
        """The crash-repair fold through ``last_seq`` (do not change it: `RepairState.copy`)."""
        return self._memory.repair

    @property
    def settings(self) -> dict:
        """``approvalPolicy``/``sandbox``/``owner``/``name`` as logged through ``last_seq`` (None:
        never logged)."""
        return self._memory.settings

    @property
    def activity(self) -> dict:
        """``updatedAt``/``lastExit`` through ``last_seq`` (`snapshot.activity_of` of the tail
        over the last durable snapshot's, kept as events are appended)."""
        return self._memory.activity

    @property
    def snapshot(self) -> dict | None:
        """The owner's dict of the last durable snapshot (None: none yet)."""
        return self._memory.snapshot

    @property
    def snapshot_seq(self) -> int:
        """Seq of the last durable snapshot (-1: none)."""
        return self._memory.snapshot_seq

    @property
    def snapshot_offset(self) -> int | None:
        """Byte offset of the last durable snapshot's frame (None: none)."""
        return self._memory.snapshot_offset
