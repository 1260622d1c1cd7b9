"""Reading a zstd log from a snapshot: finding the last one cheaply, paged and whole reads (STORAGE.md §7).

Theory of operation: a log with trailers can be walked *backwards* without decompressing it:
the last 16 bytes are the last frame's trailer, which gives that frame's length, and so on.
`last_snapshot` walks back from the end over trailers, decompressing only the frames it
passes (those after the last snapshot, which an open verifies anyway), until it meets a
``log/snapshot`` frame; it gives up (None) on anything that is not a clean trailer (a torn
tail, an old log without trailers): the caller then falls back to the summary's
``snapshotOffset`` (`snapshot_at` validates the frame there) or to a read from the header.

`read_events` pages: it follows the ``prev`` chain back from the last snapshot to the newest
one at or before the first seq wanted, then reads forward frame by frame (`_forward`) with one
decompressor, verifying each frame it reads (trailer, content checksum, JSON, seq density),
and stops after ``limit`` events. The file is read with ``pread`` in growing chunks, never
whole. A frame cut at the end of the range read is the write in flight (or a torn tail, which
the writer fixes): the read stops there. `iter_all` reads every event from the header.
Everything here only reads, and raises `LogCorrupt` (or `LogTooNew`) on damage.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

import zstandard

from dshd.paths import is_valid_id

from .errors import LogCorrupt, LogTooNew
from .format import (
    KNOWN_TYPES,
    TRAILER_HEAD,
    TRAILER_SIZE,
    Event,
    Header,
    HeaderTooNew,
    decode_event,
    decode_header,
    encode_trailer,
    scan_zstd_frame,
)
from .snapshot import SNAPSHOT_TYPE

_CHUNK = 1 << 16


class LogView:
    """``pread`` access to the first ``size`` bytes of one log (the fd is the caller's)."""

    def __init__(self, fd: int, size: int, session_id: str, path: Path) -> None:
        self.fd, self.size, self.session_id, self.path = fd, size, session_id, Path(path)
        self.dctx = zstandard.ZstdDecompressor()  # one per read, reused for every frame
        self.bytes_read = 0
        self.frame_pos = 0  # the frame `forward` last yielded events of

    def read(self, pos: int, n: int) -> bytes:
        n = max(0, min(n, self.size - pos))
        chunks, got = [], 0
        while got < n:
            chunk = os.pread(self.fd, n - got, pos + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        self.bytes_read += got
        return b"".join(chunks)

    def corrupt(self, offset: int, reason: str) -> LogCorrupt:
        return LogCorrupt(self.session_id, self.path, offset, reason)

    def scan(self, pos: int):
        """(FrameScan at 0 of the bytes read, those bytes) for the frame at ``pos``."""
        want = _CHUNK
        while True:
            buf = self.read(pos, want)
            scan = scan_zstd_frame(buf, 0)
            if scan.kind != "torn" or pos + len(buf) >= self.size:
                return scan, buf
            want *= 4

    def decompress(self, frame: bytes | memoryview, pos: int) -> bytes:
        d = self.dctx.decompressobj()
        try:
            out = d.decompress(frame)
        except zstandard.ZstdError as e:
            raise self.corrupt(pos, f"frame does not decompress ({e})") from None
        if not d.eof or d.unused_data:
            raise self.corrupt(pos, "frame does not end where its structure ends")
        return out


def read_header(view: LogView) -> tuple[Header, int, bool]:
    """(header, offset after its frame and trailer, the log has trailers from its start)."""
    scan, buf = view.scan(0)
    if scan.kind != "frame" or not scan.checksum:
        raise view.corrupt(0, "the header frame is incomplete or damaged")
    lines = view.decompress(memoryview(buf)[: scan.end], 0).split(b"\n")
    if len(lines) != 2 or lines[1]:
        raise view.corrupt(0, "the header frame holds more than one line")
    try:
        header = decode_header(lines[0])
    except HeaderTooNew as e:
        raise LogTooNew(view.session_id, view.path, 0, str(e)) from None
    except ValueError as e:
        raise view.corrupt(0, f"bad header line ({e})") from None
    if header.id != view.session_id:
        raise view.corrupt(0, f"the header names session {header.id!r}")
    trailer = view.read(scan.end, TRAILER_SIZE)
    if trailer == encode_trailer(memoryview(buf)[: scan.end]):
        return header, scan.end + TRAILER_SIZE, True
    return header, scan.end, False


def _snapshot_of(view: LogView, frame: bytes, pos: int) -> Event | None:
    """The snapshot a one-line frame holds, else None (raises on a frame that is damaged)."""
    content = view.decompress(frame, pos)
    if content.count(b"\n") != 1 or SNAPSHOT_TYPE.encode() not in content:
        return None
    try:
        ev = decode_event(content[:-1])
    except ValueError as e:
        raise view.corrupt(pos, f"event line does not parse ({e})") from None
    return ev if ev.type == SNAPSHOT_TYPE and ev.ignorable else None


#: The start of a snapshot's line as the writer encodes it (`memory.PendingSnapshot`): seq,
#: time, type, then data's through, verifiedThrough, prev.
_SNAPSHOT_HEAD = re.compile(
    rb'\{"seq":(\d+),"time":-?\d+,"type":"log/snapshot","data":\{"through":-?\d+,'
    rb'"verifiedThrough":\d+,"prev":(null|\d+)[,}]')


def _head(view: LogView, frame: bytes | memoryview) -> bytes:
    """The first bytes a frame decompresses to, without decompressing it all (navigation
    only: the trailer's CRC-32 covered the bytes; the frame is verified when it is read)."""
    try:
        with view.dctx.stream_reader(bytes(frame)) as reader:
            return reader.read(256)
    except zstandard.ZstdError:
        return b""


def _snapshot_frame(view: LogView, offset: int) -> memoryview:
    """The complete, checksummed frame at ``offset`` whose trailer matches (a snapshot's, by
    its caller's reading); `LogCorrupt` when no such frame is there."""
    scan, buf = view.scan(offset) if 0 < offset < view.size else (None, b"")
    if scan is None or scan.kind != "frame" or not scan.checksum:
        raise view.corrupt(offset, "no complete snapshot frame where one is named")
    frame = memoryview(buf)[: scan.end]
    if view.read(offset + scan.end, TRAILER_SIZE) != encode_trailer(frame):
        raise view.corrupt(offset, "the snapshot frame's trailer does not match")
    return frame


def _snapshot_head(view: LogView, offset: int) -> tuple[int, int | None]:
    """(seq, prev) of the snapshot whose frame (and trailer) is at ``offset``, reading only
    its head when it has the writer's shape; `LogCorrupt` when no snapshot is there."""
    frame = _snapshot_frame(view, offset)
    m = _SNAPSHOT_HEAD.match(_head(view, frame))
    if m is not None:
        return int(m[1]), None if m[2] == b"null" else int(m[2])
    ev = snapshot_at(view, offset)
    return ev.seq, ev.data.get("prev")


def last_snapshot(view: LogView, header_end: int) -> tuple[int, Event] | None:
    """(offset, event) of the last snapshot, found by walking back over trailers; None when
    the walk cannot go on (no trailer at the end, a mismatch, damage) or reaches the header."""
    pos = view.size
    while pos - TRAILER_SIZE > header_end:
        trailer = view.read(pos - TRAILER_SIZE, TRAILER_SIZE)
        if trailer[:8] != TRAILER_HEAD:
            return None
        start = pos - TRAILER_SIZE - int.from_bytes(trailer[8:12], "little")
        if start < header_end:
            return None
        frame = view.read(start, pos - TRAILER_SIZE - start)
        if zlib.crc32(frame) != int.from_bytes(trailer[12:], "little"):
            return None
        head = _head(view, frame)
        if head and b'"type":"log/snapshot"' not in head[:200]:
            pos = start  # not a snapshot: skipped on its head alone
            continue
        try:
            ev = _snapshot_of(view, frame, start)
        except LogCorrupt:
            return None  # the forward read from an earlier start reports it
        if ev is not None:
            return start, ev
        pos = start
    return None


def snapshot_at(view: LogView, offset: int) -> Event:
    """The snapshot whose frame (and trailer) is at ``offset``; `LogCorrupt` when there is
    none there (a ``prev`` or ``snapshotOffset`` that names no snapshot)."""
    frame = _snapshot_frame(view, offset)
    ev = _snapshot_of(view, bytes(frame), offset)
    if ev is None:
        raise view.corrupt(offset, "the frame named as a snapshot is not one")
    return ev


def forward(view: LogView, pos: int, next_seq: int, trailers: bool) -> Iterator[Event]:
    """Every event from the frame at ``pos`` (which holds seq ``next_seq`` first), verified."""
    while pos < view.size:
        scan, buf = view.scan(pos)
        if scan.kind == "torn":
            return  # the write in flight, or a torn tail the writer fixes
        if scan.kind == "bad":
            if not view.read(pos, view.size - pos).strip(b"\0"):
                return
            raise view.corrupt(pos, scan.reason)
        if scan.kind == "skippable":
            if trailers and buf.startswith(TRAILER_HEAD):
                raise view.corrupt(pos, "a frame trailer without its frame")
            pos += scan.end
            continue
        if not scan.checksum:
            raise view.corrupt(pos, "frame written without a content checksum")
        frame = memoryview(buf)[: scan.end]
        content = view.decompress(frame, pos)
        end = pos + scan.end
        present = view.read(end, TRAILER_SIZE)
        trailers = trailers or present.startswith(TRAILER_HEAD)
        if trailers and present != encode_trailer(frame):
            if end + TRAILER_SIZE >= view.size and encode_trailer(frame).startswith(
                    present.rstrip(b"\0")):
                return  # the append in flight (or torn): not durable yet
            raise view.corrupt(pos, f"the trailer at byte {end} does not match its frame")
        if not content.endswith(b"\n"):
            raise view.corrupt(pos, "frame does not end with a complete line")
        view.frame_pos = pos
        for line in content[:-1].split(b"\n"):
            ev = _event(view, line, pos, next_seq)
            next_seq += 1
            yield ev
        pos = end + (TRAILER_SIZE if trailers else 0)


def _event(view: LogView, line: bytes, pos: int, seq: int) -> Event:
    try:
        ev = decode_event(line)
    except ValueError as e:
        raise view.corrupt(pos, f"event line does not parse ({e})") from None
    if ev.seq != seq:
        raise view.corrupt(pos, f"seq gap: expected {seq}, found {ev.seq}")
    if ev.type not in KNOWN_TYPES and not ev.ignorable:
        raise LogTooNew(view.session_id, view.path, pos, f"unknown event type {ev.type!r}")
    return ev


def start_for(view: LogView, header_end: int, first_seq: int,
              snapshot_offset: int | None) -> tuple[int, int]:
    """(offset, seq there) of the newest snapshot at or before ``first_seq`` (following
    ``prev`` back from ``snapshot_offset``, else from the last snapshot), else the first
    frame after the header."""
    if snapshot_offset is None:
        found = last_snapshot(view, header_end)
        if found is None:
            return header_end, 0
        snapshot_offset = found[0]
    offset: int | None = snapshot_offset
    while offset is not None:
        seq, prev = _snapshot_head(view, offset)  # the whole frame is verified when read
        if seq <= first_seq:
            return offset, seq
        if prev is not None and (type(prev) is not int or prev >= offset):
            raise view.corrupt(offset, f"the snapshot names a bad previous snapshot {prev!r}")
        offset = prev
    return header_end, 0


def read_events(session_dir: Path, session_id: str, after_seq: int, limit: int, *,
                snapshot_offset: int | None = None, end: int | None = None) -> list[Event]:
    """Events with seq > ``after_seq``, oldest first, at most ``limit`` (STORAGE.md §7).

    Reads only the frames it needs and verifies each (`LogCorrupt`, `LogTooNew` on damage).
    ``snapshot_offset``: the last snapshot's offset when the caller knows it (the writer);
    ``end``: read no further than this offset (the writer's durable end). Raises
    `FileNotFoundError` (no log), `ValueError` (bad id or arguments). Sync: call it in a
    worker thread.
    """
    from .reader import find_log, parse_log

    if not is_valid_id(session_id):
        raise ValueError(f"invalid session id: {session_id!r}")
    if limit < 0:
        raise ValueError("limit must be >= 0")
    path, compression = find_log(Path(session_dir), session_id)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size if end is None else min(end, os.fstat(fd).st_size)
        if limit == 0:
            return []
        if compression == "none":  # plain logs (debugging) are read whole
            read = parse_log(os.pread(fd, size, 0), session_id=session_id, path=path,
                             compression="none")
            return [ev for ev in read.events if ev.seq > after_seq][:limit]
        view = LogView(fd, size, session_id, path)
        _, header_end, trailers = read_header(view)
        start, seq = start_for(view, header_end, max(after_seq + 1, 0), snapshot_offset)
        out: list[Event] = []
        for ev in forward(view, start, seq, trailers or start > header_end):
            if ev.seq > after_seq:
                out.append(ev)
                if len(out) >= limit:
                    break
        return out
    finally:
        os.close(fd)


def iter_all(session_dir: Path, session_id: str) -> Iterator[Event]:
    """Every event of a zstd or plain log, oldest first, verified as it is read (one pass,
    one decompressor; the history and fsck). Raises like `read_events`, lazily."""
    from .reader import find_log, parse_log

    if not is_valid_id(session_id):
        raise ValueError(f"invalid session id: {session_id!r}")
    path, compression = find_log(Path(session_dir), session_id)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if compression == "none":
            yield from parse_log(os.pread(fd, size, 0), session_id=session_id, path=path,
                                 compression="none").events
            return
        view = LogView(fd, size, session_id, path)
        _, header_end, trailers = read_header(view)
        yield from forward(view, header_end, 0, trailers)
    finally:
        os.close(fd)


def open_read(fd: int, session_id: str, path: Path, compression: str, read_all, parse_log,
              summary_offset: int | None = None):
    """The `reader.LogRead` an open for write needs: from the last snapshot (found by the
    trailer walk, else ``summary_offset``: the summary's ``snapshotOffset``, validated here),
    else the whole log; in fold mode
    (the events after the last snapshot, the repair and settings folds)."""
    size = os.fstat(fd).st_size
    if compression == "zstd" and size:
        view = LogView(fd, size, session_id, path)
        try:
            header, header_end, _ = read_header(view)
            found = last_snapshot(view, header_end) or _snapshot_or_none(view, summary_offset)
        except (LogCorrupt, LogTooNew):
            found = None  # the whole read below names the damage
        if found is not None:
            offset, ev = found
            return parse_log(view.read(offset, size - offset), session_id=session_id,
                             path=path, compression="zstd", base=offset, start=ev,
                             header=header)
    return parse_log(read_all(fd), session_id=session_id, path=path, compression=compression,
                     fold=True)


def _snapshot_or_none(view: LogView, offset: int | None) -> tuple[int, Event] | None:
    if offset is None:
        return None
    try:
        return offset, snapshot_at(view, offset)
    except LogCorrupt:
        return None
