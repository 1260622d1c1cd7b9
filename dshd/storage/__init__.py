"""Session storage: the durable event log, its locks, crash repair and output sidecars (STORAGE.md).

Theory of operation: the log is the truth. `SessionLog` (writer.py) is the one write handle
of a session: ``append`` in memory, ``flush`` (or the coalescing ``run`` task) makes it
durable with one zstd frame per batch and group commit; logfile.py is its file side (the fd,
the session lock, pwrite + fsync, publishing). `read_log` (reader.py) reads and checks a log
without changing it, and recovers a torn tail (torn.py judges a zstd log's last frame).
format.py is the pure v1 format, lock.py the daemon and session locks, repair.py the pure
crash closers, sidecar.py the pending output checkpoints, fsck.py the offline check (and
fsck_cli.py its command, ``python -m dshd fsck --offline``). Errors form one tree under
`StorageError` (errors.py).
"""

from .errors import LockHeld, LogCorrupt, LogTooNew, StorageError, StorageWriteError
from .format import KNOWN_TYPES, LOG_NAME_PLAIN, LOG_NAME_ZSTD, Event, Header
from .lock import DaemonLock
from .reader import LogRead, list_session_dirs, read_log, session_dir_for
from .repair import repair_closers
from .sidecar import PendingOutput, read_pending_window
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
    "SessionLog",
    "StorageError",
    "StorageWriteError",
    "list_session_dirs",
    "read_log",
    "read_pending_window",
    "repair_closers",
    "session_dir_for",
]
