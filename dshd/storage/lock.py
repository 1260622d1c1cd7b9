"""Exclusive, non-blocking file locks: one daemon per state dir, one writer per session (STORAGE.md §4).

Theory of operation: a lock is an ``flock`` (through portalocker, exclusive and non-blocking)
on a file that is never unlinked: ``<state>/dshd.lock`` for the daemon, ``session.lock`` in a
session directory for its writer. After locking we check that the file we locked is still the
one at the path (same device and inode); if someone replaced it we let go and try again, so
two processes can never each hold "the" lock on different inodes. The holder writes its pid
into the file, so a refused process can say who holds it (`LockHeld.holder`).

``flock`` locks belong to the open file description, so a second open of the same lock file in
the *same* process is refused too; `SessionLog` additionally keeps an in-process claim set so
that refusal happens before any file is touched and says so. Everything here is blocking
but never waits (non-blocking lock, small local files); callers in trio run it in a thread
when it sits next to other file work.
"""

from __future__ import annotations

import os
from pathlib import Path

import portalocker

from .errors import LockHeld, StorageError

_ATTEMPTS = 5


def _read_holder(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 64, 0)
    except OSError:
        return None
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def lock_file(path: Path) -> int:
    """Create (0600) and exclusively lock ``path``; return the open fd, which holds the lock.

    Writes this process's pid into the file. Raises `LockHeld` (with the holder's pid when the
    file names one) when another open file description holds it, `OSError` when the file
    cannot be opened (e.g. `FileNotFoundError` for a missing directory).
    """
    path = Path(path)
    for _ in range(_ATTEMPTS):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            portalocker.lock(fd, portalocker.LOCK_EX | portalocker.LOCK_NB)
        except portalocker.AlreadyLocked:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockHeld(path, holder) from None
        except portalocker.LockException as e:
            os.close(fd)
            raise StorageError(f"cannot lock {path}: {e}") from e
        except BaseException:
            os.close(fd)
            raise
        try:
            st = os.stat(path)
            fst = os.fstat(fd)
            same = (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)
        except FileNotFoundError:
            same = False
        except BaseException:
            os.close(fd)
            raise
        if not same:
            os.close(fd)  # the path now names another file: lock that one instead
            continue
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the pid is a courtesy for error messages; the lock is what counts
        return fd
    raise LockHeld(path, "nobody stable: the lock file keeps being replaced")


def unlock_file(fd: int) -> None:
    """Release a lock taken by `lock_file` and close its fd. The file stays (never unlinked)."""
    try:
        portalocker.unlock(fd)
    finally:
        os.close(fd)


class DaemonLock:
    """One dshd per state directory: an exclusive lock on ``<state>/dshd.lock`` (STORAGE.md §1, §4).

    ``acquire()`` creates the state directory (0700) if needed, locks, and records the pid;
    it raises `LockHeld` naming the holder's pid when another process (or another
    `DaemonLock` in this one) holds it. ``release()`` is idempotent. Usable as a context
    manager.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / "dshd.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError("DaemonLock already acquired")
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fd = lock_file(self.path)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            unlock_file(fd)

    def __enter__(self) -> DaemonLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
