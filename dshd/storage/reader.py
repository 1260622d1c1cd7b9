"""Reading a session log and recovering its torn tail, without ever changing the file (STORAGE.md §5).

Theory of operation: the whole file is read into memory and parsed in one pass.

- **zstd**: frame boundaries come from the frame *structure* (`format.scan_zstd_frame`: header,
  3-byte block headers, checksum), not from trying to decompress. A frame whose structure is
  complete is decompressed on its own with a fresh decompressor; zstd verifies its content
  checksum at the end of the frame. Any failure there (checksum, decompression, a line that
  does not parse, a seq gap) is damage: `LogCorrupt` naming the session, the file and the
  frame's byte offset.
- **Torn tail**: the file ends inside the last frame (or, plain, the last line has no ``\\n``)
  *and* the bytes there are a prefix of a valid frame (record); anything else is damage, so a
  flipped bit in a durable last frame is refused instead of being dropped as "torn". For zstd,
  "a prefix of a valid frame" (`_torn_frame_problem`) means, for the frames this writer writes:
  the magic; a frame header descriptor with the reserved bit clear, the content checksum flag
  set and no dictionary id; every *complete* block of a valid type, no larger than the block
  maximum (the window, at most 128 KiB), decompressing, and the output never beyond the
  header's content size (equal to it once the last block is complete, and then the checksum
  bytes present must be the start of the content's checksum); the block the file ends in no
  larger than what the content size leaves (RFC 8878: a compressed block is smaller than its
  output, a raw or RLE block's size *is* its output). No complete, checksum-valid frame may
  start after it. **Trailers decide exactly**: this writer follows every frame with its
  trailer (`format.encode_trailer`) in the same write, so new logs have them throughout and a
  log written before trailers has them on every frame appended since (the first trailer seen
  switches the log to trailers; every later frame must have one). A crash leaves a file that
  does not end in the last frame's trailer. So a frame that looks cut short while a trailer
  head follows it, or while the last 16 bytes are its trailer (any one of head, length,
  CRC-32 matching), is damage, however many header bits were flipped; a complete frame whose
  trailer is cut (or zeros) is a torn append, its lines kept as recovered; a trailer that
  does not match its frame is damage. A last frame of a log without trailers (an old log not
  appended to since) also gets the older, weaker check: no single flipped bit in the frame
  header or a block header may turn it into a complete, checksum-valid frame ending at EOF
  (two flips can beat that one). A run of
  zero bytes at EOF (power loss: the size reached the disk, the data did not) is allowed: the
  bytes before it are judged. For plain logs the last line without ``\\n`` is torn only when the
  JSON parser stops *at its end* (input truncated, or a number cut short); a complete value
  followed by anything else is damage. Plain logs carry no checksum: a flip inside a value is
  not detectable there. Of a torn frame the complete blocks' complete lines that parse and
  carry the next seq are kept (``recovered``).
- The first frame (line) is the header: exactly one line, ``version`` 1 (a newer version is
  `LogTooNew`), ``id`` equal to the session id. Event seq is dense from 0; an unknown event type
  without ``ignorable`` is `LogTooNew`.

Reads never write: the write handle (`writer.SessionLog`) fixes a torn tail on its first write.
"""

from __future__ import annotations

import errno
import os
import re
import zlib
from pathlib import Path

import msgspec
import zstandard

from dshd.paths import is_valid_id

from .errors import LogCorrupt, LogTooNew
from .format import (
    FORMAT_VERSION,
    KNOWN_TYPES,
    LOG_NAME_PLAIN,
    LOG_NAME_ZSTD,
    TRAILER_HEAD,
    TRAILER_SIZE,
    ZSTD_MAGIC,
    Event,
    Header,
    HeaderTooNew,
    decode_event,
    decode_header,
    encode_trailer,
    scan_zstd_frame,
)

_LOG_NAME_RE = re.compile(r"session\.v(\d+)\.jsonl(?:\.zst)?")


class LogRead(msgspec.Struct):
    """What `read_log` found.

    ``events``: every event in seq order, recovered ones included. ``torn``: the file ends
    inside its last frame (line). ``valid_bytes``: the offset where the torn tail starts (the
    file size when not torn). ``recovered``: the events kept from the torn tail (already in
    ``events``). ``path``/``compression`` (``"zstd"`` | ``"none"``)/``size``: the file read.
    ``trailers``: the log carries trailers (`format.encode_trailer`), from its header frame on
    or, for a log written before trailers, from the first frame appended since.
    """

    header: Header
    events: list[Event]
    torn: bool
    valid_bytes: int
    recovered: list[Event]
    path: Path
    compression: str
    size: int
    trailers: bool = False


def session_dir_for(state_dir: Path, session_id: str) -> Path:
    """``<state>/sessions/<id>`` (STORAGE.md §1). Raises ValueError for an invalid id."""
    if not is_valid_id(session_id):
        raise ValueError(f"invalid session id: {session_id!r}")
    return Path(state_dir) / "sessions" / session_id


def list_session_dirs(state_dir: Path) -> list[str]:
    """Sorted ids of the directories under ``<state>/sessions`` whose names are valid ids.

    Damaged or log-less sessions are listed too (the caller reads each). [] when the
    ``sessions`` directory does not exist.
    """
    try:
        entries = list(os.scandir(Path(state_dir) / "sessions"))
    except FileNotFoundError:
        return []
    return sorted(e.name for e in entries if is_valid_id(e.name) and e.is_dir(follow_symlinks=False))


def find_log(session_dir: Path, session_id: str) -> tuple[Path, str]:
    """Return ``(path, compression)`` of the v1 log in ``session_dir``.

    Raises `FileNotFoundError` when there is no log (or no directory), `LogTooNew` when only a
    newer version's log exists, `LogCorrupt` when both a zstd and a plain v1 log exist.
    """
    session_dir = Path(session_dir)
    zst, plain = session_dir / LOG_NAME_ZSTD, session_dir / LOG_NAME_PLAIN
    has_zst, has_plain = os.path.lexists(zst), os.path.lexists(plain)
    if has_zst and has_plain:
        raise LogCorrupt(session_id, zst, 0, f"both {LOG_NAME_ZSTD} and {LOG_NAME_PLAIN} exist")
    if has_zst:
        return zst, "zstd"
    if has_plain:
        return plain, "none"
    for name in sorted(os.listdir(session_dir)):
        m = _LOG_NAME_RE.fullmatch(name)
        if m and int(m.group(1)) > FORMAT_VERSION:
            raise LogTooNew(session_id, session_dir / name, 0, f"only {name} exists")
    raise FileNotFoundError(errno.ENOENT, "no session log yet", str(zst))


def read_log(session_dir: Path, session_id: str) -> LogRead:
    """Read and check the log of one session (STORAGE.md §5); never changes the file.

    Raises `ValueError` (invalid id), `FileNotFoundError` (no log yet), `LogCorrupt`,
    `LogTooNew`.
    """
    if not is_valid_id(session_id):
        raise ValueError(f"invalid session id: {session_id!r}")
    path, compression = find_log(session_dir, session_id)
    with open(path, "rb") as f:
        data = f.read()
    return parse_log(data, session_id=session_id, path=path, compression=compression)


def parse_log(data: bytes, *, session_id: str, path: Path, compression: str) -> LogRead:
    """Parse the bytes of a whole log (pure). Same verdicts as `read_log`."""
    lines = _LineChecker(session_id, Path(path))
    if compression == "zstd":
        torn, valid, trailers = _parse_zstd(data, lines)
    elif compression == "none":
        (torn, valid), trailers = _parse_plain(data, lines), False
    else:
        raise ValueError(f"unknown compression {compression!r}")
    assert lines.header is not None
    return LogRead(
        header=lines.header,
        events=lines.events,
        torn=torn,
        valid_bytes=valid,
        recovered=lines.recovered,
        path=Path(path),
        compression=compression,
        size=len(data),
        trailers=trailers,
    )


class _LineChecker:
    """Accepts lines in order: the header first, then events with dense seq."""

    def __init__(self, session_id: str, path: Path) -> None:
        self.session_id = session_id
        self.path = path
        self.header: Header | None = None
        self.events: list[Event] = []
        self.recovered: list[Event] = []

    def corrupt(self, offset: int, reason: str) -> LogCorrupt:
        return LogCorrupt(self.session_id, self.path, offset, reason)

    def complete(self, line: bytes, offset: int) -> None:
        """A line from a complete frame: anything wrong is damage (or too new)."""
        if self.header is None:
            try:
                header = decode_header(line)
            except HeaderTooNew as e:
                raise LogTooNew(self.session_id, self.path, offset, str(e)) from None
            except ValueError as e:
                raise self.corrupt(offset, f"bad header line ({e})") from None
            if header.id != self.session_id:
                raise self.corrupt(offset, f"the header names session {header.id!r}")
            self.header = header
            return
        try:
            event = decode_event(line)
        except ValueError as e:
            raise self.corrupt(offset, f"event line does not parse ({e})") from None
        expected = len(self.events)
        if event.seq != expected:
            raise self.corrupt(offset, f"seq gap: expected {expected}, found {event.seq}")
        if event.type not in KNOWN_TYPES and not event.ignorable:
            raise LogTooNew(self.session_id, self.path, offset, f"unknown event type {event.type!r}")
        self.events.append(event)

    def tentative(self, line: bytes) -> bool:
        """A complete line from a torn tail: keep it if it is a well-formed next event."""
        if self.header is None:
            return False
        try:
            event = decode_event(line)
        except ValueError:
            return False
        if event.seq != len(self.events):
            return False
        if event.type not in KNOWN_TYPES and not event.ignorable:
            return False
        self.events.append(event)
        self.recovered.append(event)
        return True


def _plain_prefix_problem(tail: bytes) -> str | None:
    """Why ``tail`` (a last line without ``\\n``, trailing NULs removed) cannot be the start of
    a record line, or None when it can (or is a whole record)."""
    try:
        decode_event(tail)
        return None
    except msgspec.DecodeError as exc:
        text = str(exc)
    except msgspec.ValidationError:
        return None  # complete JSON: judged as a record by the caller
    if text == "Input data was truncated":
        return None
    m = re.fullmatch(r"JSON is malformed: invalid number \(byte (\d+)\)", text)
    if m and int(m.group(1)) >= len(tail) - 1:
        return None  # a number cut short by the end of the file
    return f"the last line has no newline and is not the start of a record ({text})"


def _parse_plain(data: bytes, lines: _LineChecker) -> tuple[bool, int]:
    pos, n = 0, len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        if nl == -1:
            if lines.header is None:
                raise lines.corrupt(pos, "the header line is incomplete")
            tail = data[pos:].rstrip(b"\0")
            if tail:
                problem = _plain_prefix_problem(tail)
                if problem is not None:
                    raise lines.corrupt(pos, problem)
                # A torn last line: keep it only if it happens to be a whole record.
                lines.tentative(tail)
            return True, pos
        lines.complete(data[pos:nl], pos)
        pos = nl + 1
    if lines.header is None:
        raise lines.corrupt(0, "the log is empty")
    return False, n


def _decompress_frame(frame: bytes | memoryview) -> bytes:
    """Decompress one complete frame, verifying its checksum. Raises zstandard.ZstdError."""
    d = zstandard.ZstdDecompressor().decompressobj()
    out = d.decompress(frame)
    if not d.eof or d.unused_data:
        raise zstandard.ZstdError("frame does not end where its structure ends")
    return out


def _complete_frame_after(data: bytes, start: int) -> bool:
    """True when a complete, checksum-valid data frame starts somewhere after ``start``."""
    view = memoryview(data)
    at = data.find(ZSTD_MAGIC, start + 1)
    while at != -1:
        scan = scan_zstd_frame(view, at)
        if scan.kind == "frame" and scan.checksum:
            try:
                _decompress_frame(view[at : scan.end])
                return True
            except zstandard.ZstdError:
                pass
        at = data.find(ZSTD_MAGIC, at + 1)
    return False


def _parse_zstd(data: bytes, lines: _LineChecker) -> tuple[bool, int, bool]:
    """(torn, valid_bytes, trailers) of a zstd log; see the module doc."""
    view = memoryview(data)
    pos, n = 0, len(data)
    trailers = False
    while pos < n:
        scan = scan_zstd_frame(view, pos)
        if scan.kind == "bad":
            if lines.header is not None and not data[pos:].strip(b"\0"):
                return True, pos, trailers  # a zero-filled tail: torn, nothing to recover
            raise lines.corrupt(pos, scan.reason)
        if scan.kind == "torn":
            _judge_torn_frame(data, pos, lines, trailers)
            return True, pos, trailers
        if scan.kind == "skippable":
            if trailers and data.startswith(TRAILER_HEAD, pos):
                raise lines.corrupt(pos, "a frame trailer without its frame")
            pos = scan.end
            continue
        if not scan.checksum:
            raise lines.corrupt(pos, "frame written without a content checksum")
        try:
            content = _decompress_frame(view[pos : scan.end])
        except zstandard.ZstdError as e:
            if lines.header is not None and _zero_filled_cut(data, pos, scan.end, lines):
                return True, pos, trailers
            raise lines.corrupt(pos, f"frame does not decompress ({e})") from None
        if not content.endswith(b"\n"):
            raise lines.corrupt(pos, "frame does not end with a complete line")
        parts = content[:-1].split(b"\n")
        if lines.header is None:
            if len(parts) != 1:
                raise lines.corrupt(pos, "the header frame holds more than one line")
        # A trailer after a frame switches the log to trailers from here on (a log written
        # before trailers gets them on the frames appended since).
        trailers = trailers or data.startswith(TRAILER_HEAD, scan.end)
        end = scan.end
        if trailers or data.startswith(TRAILER_HEAD[:1], scan.end):
            # (without trailers so far: the first appended frame's trailer may be cut)
            verdict = _trailer_verdict(data, pos, scan.end)
            if verdict == "cut" and lines.header is not None:
                # The append stopped between the frame's end and its trailer's: not durable.
                _keep_torn_lines(content, lines)
                return True, pos, trailers
            if verdict is not None and trailers:
                raise lines.corrupt(pos, verdict if verdict != "cut" else
                                    "the header frame's trailer is incomplete")
            end += TRAILER_SIZE if verdict is None else 0
        for part in parts:
            lines.complete(part, pos)
        pos = end
    if lines.header is None:
        raise lines.corrupt(0, "the log is empty")
    return False, n, trailers


def _trailer_verdict(data: bytes, start: int, end: int) -> str | None:
    """Of the trailer due at ``end`` after the complete frame ``data[start:end]``: None when it
    is there and matches, ``"cut"`` when the file ends inside it (a prefix of it, then only
    zeros: power loss), else why it is damaged."""
    expected = encode_trailer(memoryview(data)[start:end])
    present = data[end : end + TRAILER_SIZE]
    if present == expected:
        return None
    same = 0
    while same < len(present) and present[same] == expected[same]:
        same += 1
    if not data[end + same :].strip(b"\0"):
        return "cut"
    return f"the trailer at byte {end} does not match its frame (head, length or CRC-32)"


def _ends_in_trailer_of(data: bytes, start: int) -> bool:
    """True when the last 16 bytes are the trailer of a frame that starts at ``start`` and
    fills the rest of the file: any one of its three parts (head, length, CRC-32) matching
    counts, so flipped bits in the trailer too cannot make a complete append read as cut."""
    n = len(data)
    if n - TRAILER_SIZE <= start:
        return False
    tail = data[n - TRAILER_SIZE :]
    length = n - TRAILER_SIZE - start
    return (
        tail[:8] == TRAILER_HEAD
        or int.from_bytes(tail[8:12], "little") == length
        or int.from_bytes(tail[12:], "little") == zlib.crc32(memoryview(data)[start : n - TRAILER_SIZE])
    )


def _judge_torn_frame(data: bytes, pos: int, lines: _LineChecker, trailers: bool) -> None:
    """The file ends inside the frame at ``pos``: keep its complete blocks' lines when it is a
    torn tail, raise `LogCorrupt` when it is damage (module doc)."""
    view, n = memoryview(data), len(data)
    if _complete_frame_after(data, pos):
        raise lines.corrupt(pos, "a frame is cut short but complete frames follow it")
    if lines.header is None:
        raise lines.corrupt(pos, "the header frame is incomplete")
    if data.find(TRAILER_HEAD, pos) != -1 or _ends_in_trailer_of(data, pos):
        raise lines.corrupt(
            pos, "the last frame looks cut short, but its append ended in a complete "
            "trailer: its frame or block header is damaged"
        )
    if not trailers:
        flipped = _flip_completes_frame(data, pos)
        if flipped is not None:
            raise lines.corrupt(
                pos, f"the last frame is complete but its header is damaged (byte {flipped})"
            )
    content, problem = _torn_frame_problem(view, pos, n)
    if problem is not None and data.endswith(b"\0"):
        # Zeros at EOF (power loss): judge the bytes before them.
        content, problem = _torn_frame_problem(view, pos, len(data.rstrip(b"\0")))
    if problem is not None:
        raise lines.corrupt(pos, f"the last frame is not a torn tail: {problem}")
    _keep_torn_lines(content, lines)


_RAW, _RLE, _COMPRESSED = 0, 1, 2


def _zstd_header(view: memoryview, start: int, n: int):
    """(header_end, content_size | None, block_max, problem) of the frame at ``start``; a header
    cut by ``n`` gives header_end None (nothing more to judge). Only the frames this writer
    writes are valid: checksum flag set, no dictionary id, reserved bit clear."""
    if start + 4 >= n:
        return None, None, 0, None  # (part of) the magic, checked by the scan
    descriptor = view[start + 4]
    if descriptor & 0x08:
        return None, None, 0, "reserved bit set in the frame header"
    if not descriptor & 0x04:
        return None, None, 0, "frame header without the content checksum flag"
    if descriptor & 0x03:
        return None, None, 0, "frame header names a dictionary"
    fcs_flag, single = descriptor >> 6, bool(descriptor & 0x20)
    fcs_size = (1 if single else 0) if fcs_flag == 0 else (2, 4, 8)[fcs_flag - 1]
    pos = start + 5
    window = None
    if not single:
        if pos >= n:
            return None, None, 0, None
        w = view[pos]
        base = 1 << (10 + (w >> 3))
        window = base + (base // 8) * (w & 7)
        pos += 1
    if pos + fcs_size > n:
        return None, None, 0, None
    content_size = None
    if fcs_size:
        content_size = int.from_bytes(view[pos : pos + fcs_size], "little")
        content_size += 256 if fcs_size == 2 else 0
    pos += fcs_size
    if single:
        window = content_size
    block_max = min(window if window is not None else 1 << 17, 1 << 17)
    return pos, content_size, block_max, None


def _torn_frame_problem(view: memoryview, start: int, n: int) -> tuple[bytes, str | None]:
    """Judge ``view[start:n]``, which ends inside a frame: (decoded content of its complete
    blocks, None) when it is a prefix of a valid frame (module doc), else (b"", why not)."""
    pos, content_size, block_max, problem = _zstd_header(view, start, n)
    if problem is not None or pos is None:
        return b"", problem
    d = zstandard.ZstdDecompressor().decompressobj()
    try:
        d.decompress(view[start:pos])
    except zstandard.ZstdError as e:
        return b"", f"the frame header does not decode ({e})"
    out = bytearray()
    while pos + 3 <= n:
        header = int.from_bytes(view[pos : pos + 3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:
            return b"", f"reserved block type at byte {pos}"
        if size > block_max:
            return b"", f"block at byte {pos} is larger than the frame allows"
        end = pos + 3 + (1 if kind == _RLE else size)
        left = None if content_size is None else content_size - len(out)
        if end > n:  # the file ends inside this block: does it fit what is left?
            if left is not None and (
                (kind == _COMPRESSED and size >= left)
                or (kind != _COMPRESSED and (size > left or (last and size != left)))
            ):
                return b"", f"block at byte {pos} is larger than the content left in its frame"
            break
        try:
            out += d.decompress(view[pos:end])
        except zstandard.ZstdError as e:
            return b"", f"the complete block at byte {pos} does not decompress ({e})"
        if left is not None and len(out) > content_size:
            return b"", "the blocks decode to more than the frame's content size"
        pos = end
        if last:
            if content_size is not None and len(out) != content_size:
                return b"", "the blocks decode to less than the frame's content size"
            present = bytes(view[pos:n])
            if present != _content_checksum(bytes(out))[: len(present)]:
                return b"", "the checksum bytes present do not match the content"
            break
    return bytes(out), None


def _content_checksum(content: bytes) -> bytes:
    """The 4 checksum bytes a zstd frame of ``content`` ends with (XXH64, low 32 bits)."""
    frame = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(content)
    return frame[-4:]


def _flip_completes_frame(data: bytes, start: int) -> int | None:
    """The byte offset of a single bit in the frame or block headers of the frame at ``start``
    whose flip makes ``data[start:]`` a complete, checksum-valid frame; None when none does."""
    buf = bytearray(data[start:])
    n = len(buf)
    candidates = list(range(4, min(18, n)))  # descriptor, window, dictionary id, content size
    scan = scan_zstd_frame(buf, 0)
    candidates += [i for p in scan.pieces for i in range(p, min(p + 3, n))]  # block headers
    for i in candidates:
        for bit in range(8):
            buf[i] ^= 1 << bit
            try:
                again = scan_zstd_frame(buf, 0)
                if again.kind == "frame" and again.end == n and again.checksum:
                    try:
                        _decompress_frame(buf)
                        return start + i
                    except zstandard.ZstdError:
                        pass
            finally:
                buf[i] ^= 1 << bit
    return None


def _zero_filled_cut(data: bytes, start: int, end: int, lines: _LineChecker) -> bool:
    """A frame that only looks complete because zeros at EOF (power loss) run through its end
    and beyond: when the bytes before the zeros are a torn prefix, keep its lines (True)."""
    if end >= len(data) or data[end:].strip(b"\0"):
        return False  # the file does not go on in zeros past this frame
    cut = len(data.rstrip(b"\0"))
    view = memoryview(data)[:cut]
    if cut <= start or scan_zstd_frame(view, start).kind != "torn":
        return False
    content, problem = _torn_frame_problem(view, start, cut)
    if problem is not None:
        return False
    _keep_torn_lines(content, lines)
    return True


def _keep_torn_lines(content: bytes, lines: _LineChecker) -> None:
    """Keep the complete, valid lines decoded from a torn frame's complete blocks."""
    for line in content.split(b"\n")[:-1]:
        if not lines.tentative(line):
            break
