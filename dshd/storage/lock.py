"""Exclusive, non-blocking locks: one daemon per state dir, one writer per session (STORAGE.md §4).

Theory of operation: a lock (`HeldLock`) is two ``flock``s, both exclusive and non-blocking:

1. on the **directory itself** (``<state>`` for the daemon, ``sessions/<id>`` for a session's
   writer), opened ``O_RDONLY | O_DIRECTORY``. A directory cannot be deleted from under a
   running daemon while it holds anything (and a replaced directory is noticed, below), so
   removing files cannot let a second writer in. This lock is the one that counts.
2. on a lock **file** in it (``dshd.lock``, ``session.lock``), never unlinked by dshd: the
   holder writes its pid there (so a refused process can say who holds it), and dshd versions
   that lock only the file still exclude us and we them.

A refused lock names the holder: the pid from ``/proc/locks`` for the directory's inode (true
even when the lock file was deleted), else the pid written in the lock file. A refusal by the
directory lock names the directory (``the state directory <state> is locked by process N``)
and says whether the lock file is still there, never a deleted file as the lock. After locking we
check that what we locked is still what the path names (same device and inode); if someone
replaced it we let go and try again, so two processes can never each hold "the" lock on
different inodes. While held, `HeldLock.verify` re-checks both identities; the session writer
calls it before every write (STORAGE.md §4): a lock file or directory that was removed or
replaced raises `LockLost` and the write does not happen. `DaemonLock.verify` is the same check
for the state directory (`StateDirMoved`), made before a session is created or opened.

A file system that refuses ``flock`` on a directory (some network file systems) falls back to
the lock file alone (``HeldLock.directory_locked`` is False); the identity checks still apply.

``flock`` locks belong to the open file description, so a second open in the *same* process is
refused too; `SessionLog` additionally keeps an in-process claim set so that refusal happens
before any file is touched and says so. Everything here is blocking but never waits
(non-blocking locks, small local files); callers in trio run it in a thread when it sits next
to other file work.
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

import portalocker

from .errors import LockHeld, LockLost, StateDirMoved, StorageError
from .format import LOCK_NAME

_ATTEMPTS = 5


def _read_holder(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 64, 0)
    except OSError:
        return None
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _flock_holder(st: os.stat_result) -> int | None:
    """The pid that holds a ``flock`` on the inode of ``st``, from ``/proc/locks`` (Linux)."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF" (blocked waiters: "->")
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == want:
                    if parts[4].isdigit():
                        return int(parts[4])
    except OSError:
        pass
    return None


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
            same = _same_file(path, fd)
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


def _same_file(path: Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _lock_file_note(path: Path) -> str:
    """What a refusal says about the lock file: present, or deleted (the directory lock holds)."""
    if os.path.lexists(path):
        return f" (see {path})"
    return f" (its lock file {path.name} was deleted; the lock on the directory itself holds)"


def lock_directory(directory: Path, lock_name: str, label: str = "the directory") -> int | None:
    """Exclusively ``flock`` ``directory`` itself; return the fd that holds it.

    None when the file system does not support ``flock`` on a directory (the caller relies on
    the lock file alone). Raises `LockHeld` naming the holder (``/proc/locks``, else the pid in
    ``directory/lock_name``), `OSError` when the directory cannot be opened.
    """
    directory = Path(directory)
    for _ in range(_ATTEMPTS):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _flock_holder(os.fstat(fd)) or _pid_in(directory / lock_name)
            os.close(fd)
            raise LockHeld(directory, holder, subject=f"{label} {directory}",
                           note=_lock_file_note(directory / lock_name)) from None
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP):
                return None
            raise
        except BaseException:
            os.close(fd)
            raise
        try:
            same = _same_file(directory, fd)
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)  # the directory was renamed away meanwhile: lock what the path names now
    raise LockHeld(directory, "nobody stable: the directory keeps being replaced",
                   subject=f"{label} {directory}")


def _pid_in(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_holder(fd)
    finally:
        os.close(fd)


class HeldLock:
    """A held lock on ``directory`` and its lock file ``directory/name`` (module doc).

    Build with `acquire`; `verify` before each write; `release` once (idempotent).
    """

    def __init__(self, directory: Path, name: str, dir_fd: int | None, file_fd: int) -> None:
        self.directory = Path(directory)
        self.path = self.directory / name
        self._dir_fd = dir_fd
        self._file_fd: int | None = file_fd

    @classmethod
    def acquire(cls, directory: Path, name: str, label: str = "the directory") -> HeldLock:
        """Lock the directory, then the lock file. Raises `LockHeld` (a refusal by the directory
        lock names ``label`` and the directory), `OSError`."""
        dir_fd = lock_directory(directory, name, label)
        try:
            file_fd = lock_file(Path(directory) / name)
        except BaseException:
            if dir_fd is not None:
                os.close(dir_fd)  # closing the last fd of the description releases its flock
            raise
        return cls(directory, name, dir_fd, file_fd)

    @property
    def directory_locked(self) -> bool:
        return self._dir_fd is not None

    @property
    def held(self) -> bool:
        return self._file_fd is not None

    def directory_is_ours(self) -> bool:
        """True while the directory path names the directory we locked (or, without a
        directory lock, the lock file's path names the file we locked)."""
        if self._file_fd is None:
            return False
        if self._dir_fd is not None:
            return _same_file(self.directory, self._dir_fd)
        return _same_file(self.path, self._file_fd)

    def verify(self) -> None:
        """Raise `LockLost` unless the paths still name the directory and file we locked."""
        if self._file_fd is None:
            raise LockLost(self.path, "it was released")
        if self._dir_fd is not None and not _same_file(self.directory, self._dir_fd):
            raise LockLost(self.path, f"its directory {self.directory} was removed or replaced")
        if not _same_file(self.path, self._file_fd):
            raise LockLost(self.path, "the lock file was removed or replaced")

    def release(self) -> None:
        file_fd, self._file_fd = self._file_fd, None
        dir_fd, self._dir_fd = self._dir_fd, None
        try:
            if file_fd is not None:
                unlock_file(file_fd)
        finally:
            if dir_fd is not None:
                os.close(dir_fd)


class DaemonLock:
    """One dshd per state directory: an exclusive lock on ``<state>`` itself and on
    ``<state>/dshd.lock`` (STORAGE.md §1, §4; `HeldLock`).

    ``acquire()`` creates the state directory (0700) if needed, locks, and records the pid;
    it raises `LockHeld` naming the holder's pid when another process (or another
    `DaemonLock` in this one) holds it, even when its ``dshd.lock`` was deleted.
    ``release()`` is idempotent. Usable as a context manager. A refusal names the state
    directory (the lock that counts) and whether ``dshd.lock`` is still there. ``verify()``
    raises `StateDirMoved` when the path no longer names the directory locked (``mv state
    state.old; mkdir state`` lets a second dshd lock the new one): the registry calls it
    before it creates or opens a session, and in its idle loop.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / "dshd.lock"
        self._lock: HeldLock | None = None

    @property
    def held(self) -> bool:
        return self._lock is not None

    def acquire(self) -> None:
        if self._lock is not None:
            raise RuntimeError("DaemonLock already acquired")
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = HeldLock.acquire(self.state_dir, self.path.name, "the state directory")

    def verify(self) -> None:
        """Raise `StateDirMoved` unless the state directory path names what we locked."""
        if self._lock is None or not self._lock.directory_is_ours():
            raise StateDirMoved(self.state_dir)

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def __enter__(self) -> DaemonLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def claim(claims: set[str] | None, session_dir: Path, session_id: str):
    """Claim ``session_id`` in ``claims`` (the owner's set of session ids with a live writer
    in this process; `LockHeld` when taken) for the log handle being built; the claim is
    given back if building it fails (``storage.writer.SessionLog``)."""
    if claims is None:
        yield
        return
    if session_id in claims:
        raise LockHeld(session_dir / LOCK_NAME, "another writer in this process")
    claims.add(session_id)
    try:
        yield
    except BaseException:
        claims.discard(session_id)
        raise
