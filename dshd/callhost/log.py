"""The call's raw output log: segments written by the host, read by the daemon (HOST.md §3).

Theory of operation: every byte the command writes is appended, in order, to a log of
segments in the call directory. Segment ``k`` holds the absolute byte range
``[k*S, (k+1)*S)`` of the stream, ``S`` being the spec's ``segment_bytes``; segment 0 is
``output.raw`` (the spill file ``details.spillPath`` names), segment ``k >= 1`` is
``output.raw.<k>``. When the writer opens segment ``k >= 4`` it unlinks segment ``k-4``, so
at most four segments (``4*S <= spill_max_bytes``) are on disk, and ``first_offset`` (the
start of the oldest retained segment) moves to ``(k-3)*S``. A segment file's size tells how
far it got: the writer only appends, so a reader needs no lock and no index.

:class:`LogWriter` (the host) appends, counts lines (``\\n`` bytes, plus one for a final line
without one) and syncs: :meth:`LogWriter.sync` fsyncs the open segment and every segment
closed since the last sync (closed ones are kept open until then, at most four), so one sync
makes everything appended so far durable. The host calls it at most once a second while
output flows and before it writes ``exit.json``.

The reader (the daemon, synchronous and quick; stdlib only): :func:`scan` tells the retained
extent from ``host.json`` (``segmentBytes``) and the files; :func:`read` returns bytes at an
absolute offset (possibly fewer than asked: it stops at what is on disk) and raises
:class:`Gap` for an offset before the oldest retained byte, including when a segment vanished
between a scan and the read. A call directory without ``host.json`` (a log written before the
call host existed) is read as one unsegmented ``output.raw`` (``segment_bytes`` 0).
"""

from __future__ import annotations

import json
import os

__all__ = ["Gap", "LogExtent", "LogWriter", "MAX_RETAINED_SEGMENTS", "count_newlines", "read",
           "scan", "segment_name"]

#: Segments kept on disk; opening segment k unlinks segment k - MAX_RETAINED_SEGMENTS.
MAX_RETAINED_SEGMENTS = 4
#: The name of segment 0 (the spill file).
BASE_NAME = "output.raw"
#: Below one newline per this many bytes (in a sample) output counts as sparse in newlines.
SPARSE_NEWLINES = 24
#: Largest ``host.json`` the reader accepts (it is a few hundred bytes).
HOST_JSON_MAX = 65536


def count_newlines(data: bytes) -> int:
    """``data.count(b"\\n")``, faster for output with few newlines.

    ``bytes.count`` of one byte is a plain per-byte loop (~0.8 ms per MiB here), while
    ``bytes.replace`` finds the bytes it deletes with ``memchr`` and copies between them: ~50x
    faster without newlines, ~3x at one newline per 77 bytes (base64), but ~2x slower for
    dense ones (``seq``). A 4 KiB sample picks the method for chunks of 64 KiB and more.
    """
    size = len(data)
    if size >= 65536 and data.count(b"\n", 0, 4096) < 4096 // SPARSE_NEWLINES:
        return size - len(data.replace(b"\n", b""))
    return data.count(b"\n")


def segment_name(k: int) -> str:
    """The file name of segment ``k``."""
    return BASE_NAME if k == 0 else f"{BASE_NAME}.{k}"


class Gap(Exception):
    """The offset asked for lies before the oldest retained byte, ``first_offset``."""

    def __init__(self, first_offset: int) -> None:
        super().__init__(f"the output before byte {first_offset} was dropped by the per-call "
                         f"disk cap (spill_max_bytes); read from {first_offset} on")
        self.first_offset = first_offset


class LogExtent:
    """The retained range ``[first_offset, end_offset)`` and the segment size (0: one file)."""

    __slots__ = ("end_offset", "first_offset", "segment_bytes")

    def __init__(self, first_offset: int, end_offset: int, segment_bytes: int) -> None:
        self.first_offset = first_offset
        self.end_offset = end_offset
        self.segment_bytes = segment_bytes

    def __repr__(self) -> str:
        return (f"LogExtent(first_offset={self.first_offset}, end_offset={self.end_offset}, "
                f"segment_bytes={self.segment_bytes})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LogExtent) and (
            (self.first_offset, self.end_offset, self.segment_bytes)
            == (other.first_offset, other.end_offset, other.segment_bytes))


class LogWriter:
    """Appends the command's output to the segments of ``directory`` (see the module doc).

    The first segment is created at construction (``O_EXCL``: a call directory that already
    has a log is refused). Errors (``OSError``) propagate: the host reports them.
    """

    def __init__(self, directory: str, segment_bytes: int) -> None:
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be at least 1")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.total_bytes = 0
        self.first_offset = 0
        self.newlines = 0
        self._last_byte = b""
        self._k = 0
        self._fd: int | None = self._open(0)
        self._unsynced: list[int] = []  # closed segments not yet fsync'd (<= 4)

    @property
    def total_lines(self) -> int:
        """Lines so far: newlines, plus one for a final line without one."""
        partial = 1 if self._last_byte not in (b"", b"\n") else 0
        return self.newlines + partial

    def _open(self, k: int) -> int:
        path = os.path.join(self.directory, segment_name(k))
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_APPEND,
                       0o600)

    def append(self, data: bytes) -> None:
        """Append ``data`` (any size), crossing into new segments as needed."""
        if not data:
            return
        self.newlines += count_newlines(data)
        self._last_byte = data[-1:]
        size = len(data)
        if size <= (self._k + 1) * self.segment_bytes - self.total_bytes:
            n = os.write(self._fd, data)  # the common case: one write, no view
            self.total_bytes += n
            if n == size:
                return
            data = data[n:]
        view = memoryview(data)
        while view:
            room = (self._k + 1) * self.segment_bytes - self.total_bytes
            if room == 0:
                self._next_segment()
                continue
            n = os.write(self._fd, view[:room])
            self.total_bytes += n
            view = view[n:]

    def _next_segment(self) -> None:
        assert self._fd is not None
        self._unsynced.append(self._fd)
        self._fd = None
        if len(self._unsynced) >= MAX_RETAINED_SEGMENTS:
            self._sync_closed()
        self._k += 1
        self._fd = self._open(self._k)
        old = self._k - MAX_RETAINED_SEGMENTS
        if old >= 0:
            try:
                os.unlink(os.path.join(self.directory, segment_name(old)))
            except FileNotFoundError:
                pass
            self.first_offset = (old + 1) * self.segment_bytes

    def _sync_closed(self) -> None:
        while self._unsynced:
            fd = self._unsynced.pop(0)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def sync(self) -> None:
        """fsync everything appended so far (the open segment and the closed ones)."""
        self._sync_closed()
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        """Sync and close (idempotent)."""
        if self._fd is None and not self._unsynced:
            return
        try:
            self.sync()
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _segment_bytes_of(directory: str) -> int | None:
    """``segmentBytes`` from ``host.json``; None when there is no ``host.json``."""
    try:
        with open(os.path.join(directory, "host.json"), "rb") as f:
            raw = f.read(HOST_JSON_MAX + 1)
    except FileNotFoundError:
        return None
    try:
        value = json.loads(raw)["segmentBytes"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{directory}/host.json is unreadable: {exc}") from None
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{directory}/host.json has an invalid segmentBytes: {value!r}")
    return value


def _segments(directory: str) -> list[int]:
    """Indexes of the segment files present, ascending."""
    found = []
    for name in os.listdir(directory):
        if name == BASE_NAME:
            found.append(0)
        elif name.startswith(BASE_NAME + ".") and name[len(BASE_NAME) + 1:].isdigit():
            found.append(int(name[len(BASE_NAME) + 1:]))
    return sorted(found)


def scan(directory: str | os.PathLike) -> LogExtent:
    """The retained extent of the log in ``directory`` (see the module doc)."""
    directory = os.fspath(directory)
    segment_bytes = _segment_bytes_of(directory)
    if segment_bytes is None:
        try:
            size = os.stat(os.path.join(directory, BASE_NAME)).st_size
        except FileNotFoundError:
            size = 0
        return LogExtent(0, size, 0)
    for _ in range(8):  # the writer may unlink a segment between the listing and the stat
        ks = _segments(directory)
        if not ks:
            return LogExtent(0, 0, segment_bytes)
        try:
            size = os.stat(os.path.join(directory, segment_name(ks[-1]))).st_size
        except FileNotFoundError:
            continue
        return LogExtent(ks[0] * segment_bytes, ks[-1] * segment_bytes + size, segment_bytes)
    raise OSError(f"the log in {directory} kept changing while it was scanned")


def read(directory: str | os.PathLike, offset: int, limit: int, segment_bytes: int) -> bytes:
    """Up to ``limit`` bytes of the log at absolute ``offset`` (fewer at the end of what is on
    disk; empty at or past the end). Raises :class:`Gap` when ``offset`` lies before the
    oldest retained byte; ``segment_bytes`` 0 reads the one unsegmented ``output.raw``."""
    if offset < 0 or limit < 0:
        raise ValueError("offset and limit must be >= 0")
    directory = os.fspath(directory)
    if segment_bytes == 0:
        return _read_file(os.path.join(directory, BASE_NAME), offset, limit) or b""
    out = bytearray()
    while len(out) < limit:
        k, within = divmod(offset + len(out), segment_bytes)
        want = min(limit - len(out), segment_bytes - within)
        chunk = _read_file(os.path.join(directory, segment_name(k)), within, want)
        if chunk is None:
            if not out:
                _raise_if_dropped(directory, k, segment_bytes)
            break
        out += chunk
        if len(chunk) < want:
            break
    return bytes(out)


def _read_file(path: str, offset: int, limit: int) -> bytes | None:
    """Bytes of ``path`` at ``offset``; None when the file does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return os.pread(fd, limit, offset) if limit else b""
    finally:
        os.close(fd)


def _raise_if_dropped(directory: str, k: int, segment_bytes: int) -> None:
    """Segment ``k`` is missing: raise :class:`Gap` when it was dropped (a later one exists),
    else return (it is not written yet)."""
    ks = _segments(directory)
    if ks and ks[-1] > k:
        raise Gap(ks[0] * segment_bytes)
