"""The file side of one session log: frames, durable appends, publishing, the lock (STORAGE.md §4).

Theory of operation: a `LogFile` owns the log's file descriptor and the session lock
(`lock.HeldLock`) and does the blocking work of `writer.SessionLog` -- which calls it in a
worker thread (`threads.run_sync`), one call at a time, under its write lock:

- **append**: re-check the lock's identity (`HeldLock.verify`: nothing is written under a lost
  lock), cut a torn tail or a failed write's bytes first if one is noted (and fsync), then
  write the payloads as frames (zstd: each frame followed by its trailer, `format.py`; plain:
  the lines) at the known-good end with ``pwrite`` and fsync. If the write or its fsync fails
  the file is truncated back to the noted size (and fsynced; if even that fails, the
  truncation is noted and done first on the next append) and the error is raised.
- **publish** (the first write of a new log): make the missing directories, fsyncing each new
  entry in its parent (a parent whose fsync failed is fsynced again on the next attempt), take
  the session lock, refuse when a log of the other format exists, write header frame + first
  batch to a temp file opened ``O_EXCL``, fsync it, ``link()`` it to the log's name (never
  overwriting), fsync the directory and unlink the temp name. The temp's fd becomes the log's.
- **open_log**: take the session lock *before* reading, then read the log through the fd that
  will write it: from its last snapshot to EOF when one is found cheaply (`pages.open_read`),
  else whole, in fold mode (`reader.parse_log`).
- **close**: close the fd, remove the session directory this handle made for a log it never
  published (when asked), release the lock.

Counters (``fsyncs``, ``frames``, ``writes``) and ``size`` (the end of the known-good bytes)
feed `SessionLog.statistics`. No trio here: every method blocks.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import zstandard

from .format import LOCK_NAME, LOG_NAME_PLAIN, LOG_NAME_ZSTD, encode_trailer
from .lock import HeldLock
from .pages import open_read
from .reader import LogRead, find_log, parse_log
from .summary import summary_snapshot_offset

__all__ = ["LogFile", "ZSTD_LEVEL", "open_log"]

ZSTD_LEVEL = 3


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError("pwrite wrote nothing")
        view = view[n:]
        offset += n


def _read_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def open_log(session_dir: Path, session_id: str) -> tuple[LogRead, int, HeldLock]:
    """Take the session lock, then read the log through the fd that will write it: ``(read,
    fd, lock)``; the caller owns fd and lock. Raises `FileNotFoundError` (no directory, no
    log), `LockHeld`, `LogCorrupt`, `LogTooNew`; nothing is left open then."""
    if not session_dir.is_dir():
        raise FileNotFoundError(2, "no such session directory", str(session_dir))
    lock = HeldLock.acquire(session_dir, LOCK_NAME)
    try:
        path, compression = find_log(session_dir, session_id)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            read = open_read(fd, session_id, path, compression, _read_all, parse_log,
                             summary_snapshot_offset(session_dir, session_id))
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        lock.release()
        raise
    return read, fd, lock


class LogFile:
    """The fd, the lock and the blocking writes of one log (see the module doc).

    ``fd``/``lock``: given for an opened log (`open_log`), None for a new one (`publish`
    makes them). ``size``: the end of its known-good bytes; ``truncate_to``: bytes to cut
    before the next append (a torn tail, or a failed write whose truncation failed).
    """

    def __init__(self, session_dir: Path, path: Path, compression: str, *, fd: int | None = None,
                 lock: HeldLock | None = None, size: int = 0,
                 truncate_to: int | None = None) -> None:
        self.session_dir = session_dir
        self.path = path
        self.compression = compression
        self.fd = fd
        self.lock = lock
        self.size = size
        self.truncate_to = truncate_to
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
        self.made_dirs: list[Path] = []  # directories this handle created (publish)
        self._unsynced_dirs: list[Path] = []  # parents whose new entry is not fsynced yet
        self.fsyncs = 0
        self.frames = 0
        self.writes = 0

    def _fsync(self, fd: int) -> None:
        self.fsyncs += 1
        os.fsync(fd)

    def _fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._fsync(fd)
        finally:
            os.close(fd)

    def _frames_of(self, payloads: list, at: int) -> tuple[bytes, list[int]]:
        """(bytes to write at ``at``, the offset of each payload's frame). A payload is bytes,
        or a callable given its frame's offset that returns them (a snapshot names its own
        offset)."""
        self.frames += len(payloads)
        out, offsets = [], []
        for p in payloads:
            offsets.append(at)
            p = p(at) if callable(p) else p
            if self.compression == "zstd":
                # Every frame is followed by its trailer (format.py): new logs and old alike.
                f = self._compressor.compress(p)
                p = f + encode_trailer(f)
            out.append(p)
            at += len(p)
        return b"".join(out), offsets

    def append(self, payloads: list) -> list[int]:
        """Write ``payloads`` as frames at the known-good end and fsync (module doc); return
        the offset of each payload's frame."""
        fd = self.fd
        assert fd is not None
        if self.lock is not None:
            self.lock.verify()  # raises LockLost: nothing is written under a lost lock
        if self.truncate_to is not None:
            os.ftruncate(fd, self.truncate_to)
            self._fsync(fd)
            self.size = self.truncate_to
            self.truncate_to = None
        if not payloads:
            return []
        noted = self.size
        blob, offsets = self._frames_of(payloads, noted)
        self.writes += 1
        try:
            _pwrite_all(fd, blob, noted)
            self._fsync(fd)
        except BaseException:
            try:
                os.ftruncate(fd, noted)
                self._fsync(fd)
            except OSError:
                self.truncate_to = noted
            raise
        self.size = noted + len(blob)
        return offsets

    def _makedirs_durable(self, path: Path) -> None:
        """Make ``path`` and its missing parents, each entry fsynced in its parent.

        A parent whose fsync failed stays in ``_unsynced_dirs`` and is fsynced again on the
        next attempt: the directory exists by then, but its entry is not durable yet.
        """
        missing = []
        while not path.is_dir():
            missing.append(path)
            if path.parent == path:
                break
            path = path.parent
        for directory in reversed(missing):
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                continue
            self.made_dirs.append(directory)
            self._unsynced_dirs.append(directory.parent)
        while self._unsynced_dirs:
            self._fsync_dir(self._unsynced_dirs[0])
            del self._unsynced_dirs[0]

    def publish(self, payloads: list) -> list[int]:
        """The first write of a new log: temp ``O_EXCL`` + fsync + ``link`` (module doc)."""
        self._makedirs_durable(self.session_dir)
        if self.lock is None:
            self.lock = HeldLock.acquire(self.session_dir, LOCK_NAME)
        else:
            self.lock.verify()
        other = self.session_dir / (LOG_NAME_PLAIN if self.compression == "zstd" else LOG_NAME_ZSTD)
        if os.path.lexists(other):
            raise FileExistsError(17, "a log of the other format already exists", str(other))
        blob, offsets = self._frames_of(payloads, 0)
        tmp = self.session_dir / f".{self.path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        self.writes += 1
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        linked = False
        try:
            _pwrite_all(fd, blob, 0)
            self._fsync(fd)
            os.link(tmp, self.path)
            linked = True
            self._fsync_dir(self.session_dir)
        except BaseException:
            os.close(fd)
            unlink_quietly(tmp)
            if linked:
                unlink_quietly(self.path)
            raise
        unlink_quietly(tmp)  # a temp left by a crash here is harmless: never read
        self.fd = fd
        self.size = len(blob)
        return offsets

    def close(self, *, remove_unpublished_dir: bool) -> None:
        """Close the fd and release the lock (idempotent); with ``remove_unpublished_dir``,
        first remove the session directory if this handle made it (only the lock file can be
        in it; anything else makes rmdir fail, and the directory stays)."""
        fd, self.fd = self.fd, None
        lock, self.lock = self.lock, None
        try:
            if fd is not None:
                os.close(fd)
            if remove_unpublished_dir and self.session_dir in self.made_dirs:
                unlink_quietly(self.session_dir / LOCK_NAME)  # still under the lock
                try:
                    os.rmdir(self.session_dir)
                except OSError:
                    pass
        finally:
            if lock is not None:
                lock.release()
