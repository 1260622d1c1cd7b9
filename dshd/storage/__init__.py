"""Session storage: the durable event log, its locks, crash repair and output sidecars (STORAGE.md).

Theory of operation: the log is the truth. `SessionLog` (writer.py) is the one write handle
of a session: ``append`` in memory, ``flush`` (or the coalescing ``run`` task) makes it
durable with one zstd frame per batch and group commit; logfile.py is its file side (the fd,
the session lock, pwrite + fsync, publishing). `read_log` (reader.py) reads and checks a log
without changing it, and recovers a torn tail (torn.py judges a zstd log's last frame).
format.py is the pure v1 format, lock.py the daemon and session locks, repair.py the
crash-repair fold (`RepairState`) and its closers, sidecar.py the pending output checkpoints,
fsck.py the offline check (and fsck_cli.py its command, ``python -m dshd fsck --offline``).
A ``log/snapshot`` event (snapshot.py) every few thousand events bounds what an open reads
(pages.py walks back to the last one over trailers; memory.py is the writer's bounded tail and
folds; opening.py and closing.py its open and close); pages.py also pages events from disk
(`read_events`, `iter_all`); summary.py keeps ``summary.json`` for cheap listing. Errors form one tree under
`StorageError` (errors.py).
"""

from .errors import LockHeld, LogCorrupt, LogTooNew, StorageError, StorageWriteError
from .format import KNOWN_TYPES, LOG_NAME_PLAIN, LOG_NAME_ZSTD, Event, Header
from .lock import DaemonLock
from .pages import iter_all, read_events
from .reader import LogRead, list_session_dirs, read_log, session_dir_for
from .repair import RepairState, repair_closers
from .sidecar import PendingOutput, read_pending_window
from .summary import SessionSummary, fold_settings, read_summary
from .writer import SessionLog

__all__ = [
    "KNOWN_TYPES",
    "LOG_NAME_PLAIN",
    "LOG_NAME_ZSTD",
    "DaemonLock",
    "Event",
    "Header",
    "LockHeld",
    "LogCorrupt",
    "LogRead",
    "LogTooNew",
    "PendingOutput",
    "RepairState",
    "SessionSummary",
    "SessionLog",
    "StorageError",
    "StorageWriteError",
    "fold_settings",
    "iter_all",
    "list_session_dirs",
    "read_log",
    "read_events",
    "read_pending_window",
    "read_summary",
    "repair_closers",
    "session_dir_for",
]
