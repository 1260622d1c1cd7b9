"""Telling a torn zstd tail from damage: the judgement of a log's last frame (STORAGE.md §5).

Theory of operation: the reader (`reader.py`) walks a zstd log frame by frame; when the file
ends inside a frame (`torn_frame`), or a complete-looking last frame does not decompress while
zeros run to EOF (`zero_filled_cut`), this module says whether those bytes are a torn append
-- and which complete lines of it can be kept -- or damage. It is pure (bytes in, verdict
out) and never decides alone what the log holds: the reader keeps the lines and raises.

A **torn tail**: the file ends inside the last frame *and* the bytes there are a prefix of a
valid frame; anything else is damage, so a flipped bit in a durable last frame is refused
instead of being dropped as "torn". "A prefix of a valid frame" (`_torn_frame_problem`) means, for the frames this writer writes:
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
CRC-32 matching), is damage, however many header bits were flipped (a complete frame whose
trailer is cut, or zeros, is a torn append, and a trailer that does not match its frame is
damage: the reader's ``_trailer_verdict`` judges those). A last frame of a log without trailers (an old log not
appended to since) also gets the older, weaker check: no single flipped bit in the frame
header or a block header may turn it into a complete, checksum-valid frame ending at EOF
(two flips can beat that one). A run of
zero bytes at EOF (power loss: the size reached the disk, the data did not) is allowed: the
bytes before it are judged. Of a torn frame the reader keeps the complete blocks' complete
lines that parse and carry the next seq (``recovered``).
"""

from __future__ import annotations

import zlib

import zstandard

from .format import TRAILER_HEAD, TRAILER_SIZE, ZSTD_MAGIC, scan_zstd_frame

__all__ = ["decompress_frame", "torn_frame", "zero_filled_cut"]


def decompress_frame(frame: bytes | memoryview,
                     dctx: zstandard.ZstdDecompressor | None = None) -> bytes:
    """Decompress one complete frame, verifying its checksum. Raises zstandard.ZstdError.
    ``dctx``: a decompressor to reuse (one per read; building one per frame is costly)."""
    d = (dctx or zstandard.ZstdDecompressor()).decompressobj()
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
                decompress_frame(view[at : scan.end])
                return True
            except zstandard.ZstdError:
                pass
        at = data.find(ZSTD_MAGIC, at + 1)
    return False


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


def torn_frame(data: bytes, pos: int, *, has_header: bool, trailers: bool
               ) -> tuple[bytes, str | None]:
    """The file ends inside the frame at ``pos``: ``(content of its complete blocks, None)``
    when it is a torn tail (keep those lines), ``(b"", why)`` when it is damage (module doc).
    ``has_header``: the header frame was read before it; ``trailers``: the log has them."""
    view, n = memoryview(data), len(data)
    if _complete_frame_after(data, pos):
        return b"", "a frame is cut short but complete frames follow it"
    if not has_header:
        return b"", "the header frame is incomplete"
    if data.find(TRAILER_HEAD, pos) != -1 or _ends_in_trailer_of(data, pos):
        return b"", ("the last frame looks cut short, but its append ended in a complete "
                     "trailer: its frame or block header is damaged")
    if not trailers:
        flipped = _flip_completes_frame(data, pos)
        if flipped is not None:
            return b"", f"the last frame is complete but its header is damaged (byte {flipped})"
    content, problem = _torn_frame_problem(view, pos, n)
    if problem is not None and data.endswith(b"\0"):
        # Zeros at EOF (power loss): judge the bytes before them.
        content, problem = _torn_frame_problem(view, pos, len(data.rstrip(b"\0")))
    if problem is not None:
        return b"", f"the last frame is not a torn tail: {problem}"
    return content, None


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
                        decompress_frame(buf)
                        return start + i
                    except zstandard.ZstdError:
                        pass
            finally:
                buf[i] ^= 1 << bit
    return None


def zero_filled_cut(data: bytes, start: int, end: int) -> bytes | None:
    """A frame that only looks complete because zeros at EOF (power loss) run through its end
    and beyond: when the bytes before the zeros are a torn prefix, the content of its complete
    blocks (keep those lines), else None."""
    if end >= len(data) or data[end:].strip(b"\0"):
        return None  # the file does not go on in zeros past this frame
    cut = len(data.rstrip(b"\0"))
    view = memoryview(data)[:cut]
    if cut <= start or scan_zstd_frame(view, start).kind != "torn":
        return None
    content, problem = _torn_frame_problem(view, start, cut)
    return None if problem is not None else content
