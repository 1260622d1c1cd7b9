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
  flipped bit in a durable last frame is refused instead of being dropped as "torn". How a
  zstd frame is judged -- the frame structure, the trailers that make "was this append
  complete?" exact, zeros at EOF -- is `torn.py`'s. For plain logs the last line without
  ``\\n`` is torn only when the JSON parser stops *at its end* (input truncated, or a number
  cut short); a complete value followed by anything else is damage. Plain logs carry no
  checksum: a flip inside a value is not detectable there. Of a torn frame the complete
  blocks' complete lines that parse and carry the next seq are kept (``recovered``).
- The first frame (line) is the header: exactly one line, ``version`` 1 (a newer version is
  `LogTooNew`), ``id`` equal to the session id. Event seq is dense from 0; an unknown event type
  without ``ignorable`` is `LogTooNew`.

Reads never write: the write handle (`writer.SessionLog`) fixes a torn tail on its first write.
"""

from __future__ import annotations

import errno
import os
import re
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
    Event,
    Header,
    HeaderTooNew,
    decode_event,
    decode_header,
    encode_trailer,
    scan_zstd_frame,
)
from .repair import RepairState
from .snapshot import (EMPTY_SETTINGS, SNAPSHOT_TYPE, fold_settings, snapshot_problem,
                       snapshot_settings)
from .torn import decompress_frame, torn_frame, zero_filled_cut

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
    #: The last snapshot read (its event; None when the part read holds none), its byte
    #: offset, and the offset the read started at (0: the whole log; else a snapshot's).
    snapshot: Event | None = None
    snapshot_offset: int | None = None
    start: int = 0
    #: The crash-repair fold and the settings fold through the last event read (fold reads).
    repair: RepairState | None = None
    settings: dict | None = None
    last_seq: int = -1


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


def read_log(session_dir: Path, session_id: str, *, fold: bool = False,
             check: bool = False) -> LogRead:
    """Read and check the whole log of one session (STORAGE.md §5); never changes the file.

    ``fold``/``check`` as in `parse_log` (fsck: both, so every snapshot is checked and only
    the events after the last one are kept).

    Raises `ValueError` (invalid id), `FileNotFoundError` (no log yet), `LogCorrupt`,
    `LogTooNew`.
    """
    if not is_valid_id(session_id):
        raise ValueError(f"invalid session id: {session_id!r}")
    path, compression = find_log(session_dir, session_id)
    with open(path, "rb") as f:
        data = f.read()
    return parse_log(data, session_id=session_id, path=path, compression=compression,
                     fold=fold, check=check)


def parse_log(data: bytes, *, session_id: str, path: Path, compression: str,
              fold: bool = False, check: bool = False, base: int = 0,
              start: Event | None = None, header: Header | None = None) -> LogRead:
    """Parse the bytes of a log (pure). Same verdicts as `read_log`.

    ``fold``: keep only the events after the last snapshot in ``events`` and fold everything
    into ``repair``/``settings`` (memory bounded by the snapshot interval). ``check``: a
    snapshot that disagrees with the fold before it is damage (fsck). ``base``/``start``/
    ``header``: ``data`` is the log from byte ``base`` on, which is the frame of the snapshot
    ``start`` (already read), under ``header``: the read begins at that snapshot.
    """
    lines = _LineChecker(session_id, Path(path), fold=fold or start is not None, check=check,
                         base=base, header=header, start=start)
    if compression == "zstd":
        torn, valid, trailers = _parse_zstd(data, lines, trailers=start is not None)
    elif compression == "none":
        (torn, valid), trailers = _parse_plain(data, lines), False
    else:
        raise ValueError(f"unknown compression {compression!r}")
    assert lines.header is not None
    return LogRead(
        header=lines.header,
        events=lines.events,
        torn=torn,
        valid_bytes=valid + base,
        recovered=lines.recovered,
        path=Path(path),
        compression=compression,
        size=len(data) + base,
        trailers=trailers,
        snapshot=lines.snapshot,
        snapshot_offset=lines.snapshot_offset,
        start=base,
        repair=lines.repair,
        settings=lines.settings,
        last_seq=lines.next_seq - 1,
    )


class _LineChecker:
    """Accepts lines in order: the header first, then events with dense seq.

    In fold mode the events go through the repair and settings folds and a snapshot empties
    the kept list (module doc); ``check`` compares each snapshot with the fold before it.
    """

    def __init__(self, session_id: str, path: Path, *, fold: bool = False, check: bool = False,
                 base: int = 0, header: Header | None = None, start: Event | None = None) -> None:
        self.session_id = session_id
        self.path = path
        self.header: Header | None = header
        self.events: list[Event] = []
        self.recovered: list[Event] = []
        self.fold, self.check, self.base = fold, check, base
        self.next_seq = 0
        self.snapshot: Event | None = None
        self.snapshot_offset: int | None = None
        self.repair: RepairState | None = RepairState() if fold else None
        self.settings: dict | None = dict(EMPTY_SETTINGS) if fold else None
        self.start = start
        if start is not None:
            self.next_seq = start.seq

    def corrupt(self, offset: int, reason: str) -> LogCorrupt:
        return LogCorrupt(self.session_id, self.path, offset + self.base, reason)

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
        expected = self.next_seq
        if event.seq != expected:
            raise self.corrupt(offset, f"seq gap: expected {expected}, found {event.seq}")
        if event.type not in KNOWN_TYPES and not event.ignorable:
            raise LogTooNew(self.session_id, self.path, offset + self.base,
                            f"unknown event type {event.type!r}")
        self._accept(event, offset)

    def _accept(self, event: Event, offset: int) -> None:
        self.next_seq = event.seq + 1
        if not self.fold:
            self.events.append(event)
            return
        if event.type == SNAPSHOT_TYPE and event.ignorable:
            self._snapshot(event, offset)
            return
        self.events.append(event)
        self.repair.see(event)
        self.settings = fold_settings(self.settings, event)

    def _snapshot(self, event: Event, offset: int) -> None:
        """A snapshot: the fold restarts from it (the first one of a read from a snapshot)
        or, checked, must agree with the fold so far."""
        problem = snapshot_problem(event.data, event.seq)
        if problem is not None:
            raise self.corrupt(offset, f"the snapshot at seq {event.seq} {problem}")
        if event is self.start or (self.start is not None and event.seq == self.start.seq):
            self.repair = RepairState.from_json(event.data["repair"])
            self.settings = snapshot_settings(event.data)
        elif self.check or self.start is not None:
            if event.data["verifiedThrough"] != offset + self.base:
                raise self.corrupt(offset, f"the snapshot at seq {event.seq} says it is at byte "
                                   f"{event.data['verifiedThrough']}")
            want_prev = self.snapshot_offset
            if event.data["prev"] != want_prev:
                raise self.corrupt(offset, f"the snapshot at seq {event.seq} names the previous "
                                   f"snapshot at {event.data['prev']}, not {want_prev}")
            if event.data["repair"] != self.repair.to_json() or snapshot_settings(
                    event.data) != self.settings:
                raise self.corrupt(offset, f"the snapshot at seq {event.seq} disagrees with the "
                                   "fold of the events before it")
        self.snapshot, self.snapshot_offset = event, offset + self.base
        self.events = []

    def tentative(self, line: bytes) -> bool:
        """A complete line from a torn tail: keep it if it is a well-formed next event (a
        snapshot there is not: it is written again)."""
        if self.header is None:
            return False
        try:
            event = decode_event(line)
        except ValueError:
            return False
        if event.seq != self.next_seq or event.type == SNAPSHOT_TYPE:
            return False
        if event.type not in KNOWN_TYPES and not event.ignorable:
            return False
        self._accept(event, 0)
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


def _parse_zstd(data: bytes, lines: _LineChecker, *, trailers: bool = False
                ) -> tuple[bool, int, bool]:
    """(torn, valid_bytes, trailers) of a zstd log; see the module doc."""
    view = memoryview(data)
    pos, n = 0, len(data)
    dctx = zstandard.ZstdDecompressor()  # one per read: building one per frame is costly
    while pos < n:
        scan = scan_zstd_frame(view, pos)
        if scan.kind == "bad":
            if lines.header is not None and not data[pos:].strip(b"\0"):
                return True, pos, trailers  # a zero-filled tail: torn, nothing to recover
            raise lines.corrupt(pos, scan.reason)
        if scan.kind == "torn":
            content, problem = torn_frame(data, pos, has_header=lines.header is not None,
                                          trailers=trailers)
            if problem is not None:
                raise lines.corrupt(pos, problem)
            _keep_torn_lines(content, lines)
            return True, pos, trailers
        if scan.kind == "skippable":
            if trailers and data.startswith(TRAILER_HEAD, pos):
                raise lines.corrupt(pos, "a frame trailer without its frame")
            pos = scan.end
            continue
        if not scan.checksum:
            raise lines.corrupt(pos, "frame written without a content checksum")
        try:
            content = decompress_frame(view[pos : scan.end], dctx)
        except zstandard.ZstdError as e:
            kept = None if lines.header is None else zero_filled_cut(data, pos, scan.end)
            if kept is not None:
                _keep_torn_lines(kept, lines)
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


def _keep_torn_lines(content: bytes, lines: _LineChecker) -> None:
    """Keep the complete, valid lines decoded from a torn frame's complete blocks."""
    for line in content.split(b"\n")[:-1]:
        if not lines.tentative(line):
            break
