"""The storage layer's exceptions, as one tree (STORAGE.md §4, §5).

Theory of operation: everything the storage room raises on purpose derives from
`StorageError`, so a caller that must fail closed (the checkpoint barrier, `tool.run`) catches
one class. The subclasses say what the caller can do next:

```
StorageError
 ├── StorageWriteError   a write/fsync failed; the batch stays buffered, retry with flush()
 ├── LogCorrupt          a complete frame is damaged; refuse to write, report it (fsck)
 ├── LogTooNew           written by a newer dshd; upgrade
 ├── LockHeld            another writer (process or handle) owns the lock
 └── LockLost            the lock we hold no longer guards the path (file/dir removed or
                         replaced): no write while the paths name something else
```
Plain `OSError`s that are not about the log's integrity (a missing session directory:
`FileNotFoundError`) pass through unchanged; invalid ids are `ValueError`.
"""

from __future__ import annotations

from pathlib import Path

from protocol import rpc

from ..errors import StorageFailure


class StorageError(StorageFailure):
    """Base of every error the storage layer raises on purpose (a ``-32014`` when it reaches
    a request, ``dshd.errors``)."""

    #: One that reaches a request as it was raised reads "storage failure: ..." on the wire.
    PREFIX = "storage failure: "


class StorageWriteError(StorageError):
    """A durable write failed (STORAGE.md §4).

    The file was rolled back to its size before the write (or will be, before the next write),
    the batch is still buffered, timed writes are paused, and every `flush()` retries and raises
    this until one succeeds. `__cause__` is the underlying `OSError` (or `LockHeld`).
    """


class LogCorrupt(StorageError):
    """A complete frame or line of a log is damaged (STORAGE.md §5).

    Attributes: ``session_id`` (str), ``path`` (Path of the log), ``offset`` (int, bytes from
    the start of the file: the frame for zstd, the line for plain logs), ``reason`` (str).
    """

    def __init__(self, session_id: str, path: Path, offset: int, reason: str) -> None:
        self.session_id = session_id
        self.path = Path(path)
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"session {session_id}: log {self.path} is damaged at byte {offset}: {reason}; "
            "it will not be opened for writing (run `dsh fsck`)"
        )
        self.data = {"code": "LOG_DAMAGED"}


class LogTooNew(StorageError):
    """The log (or one of its events) was written by a newer dshd (STORAGE.md §2, §3).

    Attributes: ``session_id``, ``path``, ``offset`` (bytes; 0 for the header), ``detail``.
    """

    def __init__(self, session_id: str, path: Path, offset: int, detail: str) -> None:
        self.session_id = session_id
        self.path = Path(path)
        self.offset = offset
        self.detail = detail
        super().__init__(
            f"session {session_id}: log {self.path} was written by a newer dshd: upgrade "
            f"({detail}, at byte {offset})"
        )
        self.data = {"code": "LOG_DAMAGED"}


class LockHeld(StorageError):
    """An exclusive lock is held by someone else (STORAGE.md §4).

    Attributes: ``path`` (the lock file), ``holder``: the holder's pid (int) when the lock
    file names one, a description (str, e.g. ``"another handle in this process"``), or None
    when it cannot be known. A request that meets one is answered ``-32005``.
    """

    CODE = rpc.SESSION_LOCKED

    def __init__(self, path: Path, holder: int | str | None, *, subject: str | None = None,
                 note: str = "") -> None:
        self.path = Path(path)
        self.holder = holder
        if isinstance(holder, int):
            who = f"process {holder}"
        elif holder:
            who = holder
        else:
            who = "another process"
        super().__init__(f"{subject or self.path} is locked by {who}{note}")


class LockLost(StorageError):
    """A lock we hold no longer guards its path (STORAGE.md §4): the lock file or its directory
    was removed or replaced while we held it, so another process could lock the new one.

    The write it was checked for did not happen. Attributes: ``path`` (the lock file),
    ``reason`` (str).
    """

    def __init__(self, path: Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(
            f"the lock {self.path} no longer guards this session: {reason} while dshd held "
            "it, so writes are stopped (another process could take the new lock); stop whoever "
            "removed it, then restart dshd"
        )


class StateDirMoved(StorageError):
    """The state directory's path no longer names the directory this dshd locked at start: it
    was moved or replaced (``mv state state.old; mkdir state``), so another dshd may own what
    the path names now (STORAGE.md §4). No session is created or opened through the path.

    Attributes: ``path`` (the state directory).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        super().__init__(
            f"the state directory {self.path} was moved or replaced under a running dshd: this "
            "dshd locked the directory that was there when it started, and another dshd may use "
            "what the path names now, so it creates and opens no sessions there; move the "
            "directory back, or stop this dshd and start it again"
        )
