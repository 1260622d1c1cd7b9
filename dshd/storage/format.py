"""The v1 on-disk format of a session log: records, lines and zstd frame structure (STORAGE.md §2, §3).

Theory of operation: a log is a sequence of lines, each one compact JSON object ending in
``\\n``. Line 1 is the `Header`; every later line is an `Event` with a dense ``seq`` from 0.
On disk the lines are either plain (``session.v1.jsonl``) or grouped into standard zstd frames
(``session.v1.jsonl.zst``): frame 1 holds exactly the header line, every later frame holds one
durable batch of ≥ 1 event lines, each frame carries its content checksum.

This module is pure (no file system): it encodes and decodes lines with msgspec, and it walks
the *structure* of a zstd frame without decompressing it (`scan_zstd_frame`). Walking the
structure is how the reader finds frame boundaries and tells a torn tail (the file ends inside
the last frame) from damage (a frame that is complete but does not decompress, does not match
its checksum, or holds bad lines). The zstd frame format (RFC 8878 §3.1) is:

```
magic 28 B5 2F FD | descriptor | [window] | [dict id 0/1/2/4] | [content size 0/1/2/4/8]
block header (3 bytes LE: bit 0 last, bits 1-2 type, bits 3-23 size) | block payload ...
[content checksum, 4 bytes, when descriptor bit 2 is set]
```
A raw block's payload is ``size`` bytes, an RLE block's is 1 byte, a compressed block's is
``size`` bytes. Skippable frames (magic 0x184D2A5?) are skipped by readers, as zstdcat does.

**Trailers**: this writer follows every frame it writes with a 16-byte skippable *trailer*
(`encode_trailer`: magic 0x184D2A5B, size 8, the frame's length and CRC-32, both LE u32), in
the same write. A log whose header frame is followed by a trailer has one after every frame;
the trailer makes "was this append complete?" exact: an append cut by a crash never ends in its
trailer, so a last frame that looks cut short while a trailer follows it is damage, never a
torn tail, whatever bits were flipped in its headers. Logs written before trailers still read;
the frames appended to them get trailers (the first trailer seen switches a log to trailers:
every later frame must have one).
"""

from __future__ import annotations

import time
import zlib
from typing import Literal, NamedTuple

import msgspec

FORMAT_VERSION = 1
LOG_NAME_ZSTD = "session.v1.jsonl.zst"
LOG_NAME_PLAIN = "session.v1.jsonl"
LOCK_NAME = "session.lock"
COMPRESSIONS = ("zstd", "none")

#: Event types of STORAGE.md §3. A type outside this set is refused unless ``ignorable``.
KNOWN_TYPES = frozenset(
    {
        "approval/policy",
        "sandbox/mode",
        "turn/start",
        "turn/end",
        "step/start",
        "step/end",
        "message/user",
        "message/assistant",
        "tool/call",
        "approval/asked",
        "approval/decided",
        "tool/result",
    }
)


class Event(msgspec.Struct, frozen=True, omit_defaults=True):
    """One log record (STORAGE.md §3).

    ``seq``: dense from 0 within a session; ``time``: ms since the Unix epoch; ``type``: one of
    `KNOWN_TYPES` (or any string when ``ignorable``); ``data``: a JSON object whose shape the
    type names. ``ignorable`` is omitted from the line when False. ``data`` must not be
    mutated after the event was appended: the line on disk is encoded at append time.
    """

    seq: int
    time: int
    type: str
    data: dict
    ignorable: bool = False


class Header(msgspec.Struct, frozen=True, kw_only=True):
    """The first line of a log (STORAGE.md §2): ``{"type":"session","version":1,...}``.

    ``createdAt`` is ms since the Unix epoch; ``cwd`` an absolute directory; ``title`` may be
    null. Unknown extra keys are ignored when decoding.
    """

    type: str = "session"
    version: int = FORMAT_VERSION
    id: str
    createdAt: int
    cwd: str
    title: str | None = None


_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(Event)
_any_decoder = msgspec.json.Decoder()


def encode_line(record: Event | Header) -> bytes:
    """Encode one record as a compact JSON line ending in ``\\n`` (bytes).

    Raises `TypeError` for values JSON cannot carry and `UnicodeEncodeError` (a `ValueError`)
    for strings with lone surrogates; output capture maps invalid bytes to U+FFFD before this.
    """
    buf = bytearray()
    _encoder.encode_into(record, buf)
    buf += b"\n"
    return bytes(buf)


def now_ms() -> int:
    """Wall-clock time in integer ms since the Unix epoch (event ``time``)."""
    return time.time_ns() // 1_000_000


def new_event(seq: int, type: str, data: dict, *, time_ms: int, ignorable: bool = False
              ) -> tuple[Event, bytes]:
    """A new event and its line, checked (STORAGE.md §3): ``type`` a non-empty string known to
    this version unless ``ignorable``, ``data`` a dict that JSON can carry. Raises `ValueError`
    (empty or unknown type, a string with lone surrogates) or `TypeError` (``data`` not a
    dict, or not JSON-encodable)."""
    if not isinstance(type, str) or not type:
        raise ValueError("event type must be a non-empty string")
    if type not in KNOWN_TYPES and not ignorable:
        raise ValueError(f"unknown event type {type!r} (pass ignorable=True for extensions)")
    if not isinstance(data, dict):
        raise TypeError(f"event data must be a dict, got {data.__class__.__name__}")
    event = Event(seq=seq, time=time_ms, type=type, data=data, ignorable=ignorable)
    return event, encode_line(event)


def decode_event(line: bytes) -> Event:
    """Decode one event line (without its ``\\n``). Raises `msgspec.DecodeError` /
    `msgspec.ValidationError` for anything that is not a well-typed event."""
    return _event_decoder.decode(line)


class HeaderTooNew(Exception):
    """The header line names a format version newer than this code reads."""


def decode_header(line: bytes) -> Header:
    """Decode the header line (without ``\\n``).

    Raises `HeaderTooNew` for ``version`` > 1, `ValueError` for anything else that is not a
    v1 session header (`msgspec.DecodeError` and `msgspec.ValidationError` are ValueErrors).
    """
    obj = _any_decoder.decode(line)
    if not isinstance(obj, dict) or obj.get("type") != "session":
        raise ValueError("first line is not a session header")
    version = obj.get("version")
    if type(version) is int and version > FORMAT_VERSION:
        raise HeaderTooNew(f"format version {version}")
    if version != FORMAT_VERSION or type(version) is not int:
        raise ValueError(f"header names version {version!r}, the file name says {FORMAT_VERSION}")
    return msgspec.convert(obj, Header)


# --- zstd frame structure -------------------------------------------------------------------

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_SKIPPABLE_LOW = 0x184D2A50
_BLOCK_SIZE_MAX = 128 * 1024
_DICT_ID_SIZES = (0, 1, 2, 4)
_FCS_SIZES = (0, 2, 4, 8)


class FrameScan(NamedTuple):
    """Where one zstd frame starting at ``start`` ends, from its structure alone.

    ``kind``: ``"frame"`` (complete data frame), ``"skippable"`` (complete skippable frame),
    ``"torn"`` (the buffer ends inside the frame), ``"bad"`` (the bytes cannot be a frame).
    ``end``: offset just past the frame (``len(buf)`` when torn, ``start`` when bad).
    ``pieces``: offsets, increasing, after which the bytes fed to a decoder form a usable
    prefix: the end of the frame header, then the end of each complete block. ``checksum``:
    whether the descriptor announces a content checksum. ``reason`` explains ``"bad"``.
    """

    kind: Literal["frame", "skippable", "torn", "bad"]
    start: int
    end: int
    pieces: tuple[int, ...]
    checksum: bool
    reason: str = ""


def scan_zstd_frame(buf: bytes | memoryview, start: int) -> FrameScan:
    """Walk the structure of the zstd frame at ``buf[start:]`` (RFC 8878 §3.1).

    Never decompresses and never raises: the verdict is in the returned `FrameScan`.
    """
    n = len(buf)

    def torn(pieces: tuple[int, ...] = (), checksum: bool = False) -> FrameScan:
        return FrameScan("torn", start, n, pieces, checksum)

    def bad(reason: str) -> FrameScan:
        return FrameScan("bad", start, start, (), False, reason)

    magic = bytes(buf[start : start + 4])
    if len(magic) < 4:
        return torn() if ZSTD_MAGIC.startswith(magic) else bad("not a zstd frame")
    number = int.from_bytes(magic, "little")
    if number & 0xFFFFFFF0 == _SKIPPABLE_LOW:
        if start + 8 > n:
            return torn()
        end = start + 8 + int.from_bytes(buf[start + 4 : start + 8], "little")
        if end > n:
            return torn()
        return FrameScan("skippable", start, end, (), False)
    if magic != ZSTD_MAGIC:
        return bad("not a zstd frame")
    pos = start + 4
    if pos >= n:
        return torn()
    descriptor = buf[pos]
    if descriptor & 0x08:
        return bad("reserved bit set in the frame header")
    fcs_flag = descriptor >> 6
    single_segment = bool(descriptor & 0x20)
    checksum = bool(descriptor & 0x04)
    header_size = 1 + (0 if single_segment else 1) + _DICT_ID_SIZES[descriptor & 0x03]
    header_size += 1 if (single_segment and fcs_flag == 0) else _FCS_SIZES[fcs_flag]
    pos += header_size
    if pos > n:
        return torn(checksum=checksum)
    pieces = [pos]
    while True:
        if pos + 3 > n:
            return torn(tuple(pieces), checksum)
        block_header = int.from_bytes(buf[pos : pos + 3], "little")
        last = block_header & 1
        block_type = (block_header >> 1) & 3
        block_size = block_header >> 3
        if block_type == 3:
            return bad("reserved block type")
        if block_size > _BLOCK_SIZE_MAX:
            return bad("block larger than the zstd maximum")
        pos += 3 + (1 if block_type == 1 else block_size)
        if pos > n:
            return torn(tuple(pieces), checksum)
        pieces.append(pos)
        if last:
            break
    if checksum:
        pos += 4
        if pos > n:
            return torn(tuple(pieces), checksum)
    return FrameScan("frame", start, pos, tuple(pieces), checksum)


# --- frame trailers -------------------------------------------------------------------------

TRAILER_MAGIC = (0x184D2A5B).to_bytes(4, "little")
#: The first 8 bytes of every trailer: its magic and its frame size (8).
TRAILER_HEAD = TRAILER_MAGIC + (8).to_bytes(4, "little")
TRAILER_SIZE = 16


def encode_trailer(frame: bytes | memoryview) -> bytes:
    """The skippable trailer written after ``frame``: head, ``len(frame)``, CRC-32 of it."""
    return TRAILER_HEAD + len(frame).to_bytes(4, "little") + zlib.crc32(frame).to_bytes(4, "little")
