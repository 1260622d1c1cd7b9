"""Output capture from the call host's log: the retained window and its totals (EXEC.md §2).

Theory of operation
-------------------
One :class:`OutputCapture` per tool call. The call's host (:mod:`dshd.callhost`) appends every
byte the command writes to the call's raw log (``output.raw`` and its segments: that file *is*
the spill) and reports how far it got; :func:`catch_up` brings the capture up to a reported
end by reading from the log (through a *reader*, ``await reader(offset, limit) -> bytes``, that
raises :class:`Gap` for bytes no longer retained). :class:`OutputCapture` itself is pure and
synchronous: no clock, no trio, no file I/O.

The capture does not need every byte. When the unread gap is small it is fed incrementally
(:meth:`OutputCapture.feed`). When it is large (more than :func:`jump_threshold`: 4 x
``max_bytes`` + 64 KiB) in tail mode, :func:`catch_up` *jumps*: it reads only the log's tail,
growing backwards (doubling) until the cleaned tail overflows the window's limits, and rebuilds
the window from it (:meth:`OutputCapture.rebuild`). The window is the longest suffix of the
cleaned stream within both limits, so a suffix of the cleaned stream that already overflows
them has the same window and the same edge character -- and a suffix of the raw stream that
starts at a byte that is not a UTF-8 continuation byte decodes to a suffix of the decoded
stream (the decoder resynchronises at every such byte). So a jump gives exactly the window of
feeding everything; reading back to the read offset is just an incremental feed, and reading
back to the oldest retained byte (``firstOffset``) after bytes were dropped marks the window
truncated. Head mode reads from offset 0 until the window closed, then nothing more. The
daemon's CPU therefore grows with catch-ups (publishes), not with bytes.

Each chunk fed goes through two stages:

1. **Decode and clean**: an incremental UTF-8 decoder (``errors="replace"``) keeps a character
   split across reads whole and turns invalid bytes into U+FFFD; then NUL and the C0 controls
   other than ``\\t``, ``\\n`` and ESC are deleted. Cleaning works on the re-encoded, already
   valid UTF-8, where a control byte can never sit inside a multi-byte character, so deleting
   bytes is exact (an order of magnitude faster than ``str.translate`` on non-ASCII text).
2. **Window**: the cleaned text is appended to the retained window and the window is cut back to
   ``max_bytes`` UTF-8 bytes and ``max_lines`` lines. ``retain="tail"`` keeps the longest suffix
   within both limits (a line longer than ``max_bytes`` keeps its UTF-8-safe end);
   ``retain="head"`` keeps the longest prefix and, once something was cut, ignores everything
   after it. Both limits are monotone over suffixes (prefixes), so cutting ``window + new``
   gives exactly the window of the whole cleaned stream: the result does not depend on how the
   bytes were chunked, and memory is O(window + one chunk).

**Totals** are the host's (:meth:`OutputCapture.set_totals`, from its progress events and exit
record): ``totalBytes`` is every byte the command wrote; ``totalLines`` is the number of
``\\n`` bytes plus one for a final line without ``\\n``. ``droppedBytes`` (in the truncation
only when non-zero) is the log's ``firstOffset``: raw bytes no longer retained on disk.

A line, in the window as in the totals, is a ``\\n``-terminated run or a final unterminated run:
``lines(s) = s.count("\\n") + (1 if s and not s.endswith("\\n") else 0)``.

``truncated`` says the window dropped some cleaned text. ``truncatedBy`` names the limit that
decides the window's edge: with ``c`` the character just outside the window (the last one
dropped in tail mode, the first one refused in head mode), it is ``"lines"`` when ``c`` plus the
window would exceed ``max_lines``, else ``"bytes"``. Like the window, it is a function of the
whole cleaned stream only (after a jump back to ``firstOffset`` the edge may be unknown: then
``"bytes"``). Output that is dropped by cleaning (a megabyte of NULs) is not truncation: the
text is complete, the totals and the log show the rest.

Spill path: once the output first exceeds the window -- ``totalBytes > max_bytes``,
``totalLines > max_lines``, or the window cut something -- :attr:`spill_path` is set to the
log's ``output.raw`` (``details.spillPath``).

:attr:`version` bumps on every change (new bytes, new totals, the final flush); a publisher
polls it and reads :attr:`text` and :attr:`truncation`. ``offset`` counts the cleaned
characters dropped before the window as far as the capture saw them (a jump skips unseen ones).
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

__all__ = ["Gap", "OutputCapture", "ShellOutputLimits", "catch_up", "clean_text",
           "jump_threshold"]

#: C0 controls deleted from the retained text: everything below 0x20 except \t, \n and ESC.
_DROPPED_CONTROLS = bytes(b for b in range(0x20) if b not in (0x09, 0x0A, 0x1B))
#: Bytes of unread gap past 4 x max_bytes beyond which :func:`catch_up` jumps (a jump reads
#: about 4 x max_bytes, so feeding a larger gap would cost more than jumping over it).
JUMP_SLACK = 65_536
#: Largest single read of an incremental catch-up, bytes.
READ_PIECE = 4 * 1_048_576


class ShellOutputLimits(msgspec.Struct, frozen=True):
    """Window limits of one call's retained output (EXEC.md §2).

    ``max_bytes``: UTF-8 bytes of the retained text (≥ 4, so one character always fits).
    ``max_lines``: lines of the retained text (≥ 1). ``retain``: which end is kept.
    Field names are snake_case as in the daemon config; the wire's ``maxBytes``/``maxLines``
    appear only in :attr:`OutputCapture.truncation`.
    """

    max_bytes: int = 51_200
    max_lines: int = 2_000
    retain: Literal["tail", "head"] = "tail"


def clean_text(text: str) -> str:
    """``text`` without NUL and C0 controls other than ``\\t``, ``\\n``, ESC (EXEC.md §2)."""
    raw = text.encode()
    kept = raw.translate(None, _DROPPED_CONTROLS)
    return text if len(kept) == len(raw) else kept.decode()


class Gap(Exception):
    """A read asked for bytes the log no longer retains; ``first_offset`` is its oldest byte."""

    def __init__(self, first_offset: int) -> None:
        super().__init__(f"the log starts at byte {first_offset} now")
        self.first_offset = first_offset


class OutputCapture:
    """The retained window and totals of one call's output (EXEC.md §2; see the module doc).

    ``feed(data)`` takes the log's next raw bytes (from :attr:`read_offset` on);
    ``rebuild(tail, lost=...)`` replaces the window by that of a tail of the log (a jump);
    ``set_totals`` takes the host's totals; ``finish()`` ends the stream (a trailing partial
    character becomes U+FFFD); feeding after ``finish()`` is a ``RuntimeError``.
    ``ValueError`` for limits below ``max_bytes=4`` / ``max_lines=1``.

    Attributes: ``text`` (the window), ``offset`` (module doc), ``read_offset`` (raw bytes of
    the log consumed), ``spill_path`` (``log_path`` once the output exceeded the window),
    ``version`` (bumps on every change), ``finished``, ``closed`` (head mode: the window is
    full and reads nothing more).
    """

    def __init__(self, limits: ShellOutputLimits, log_path: str | os.PathLike[str] | None = None,
                 ) -> None:
        if limits.max_bytes < 4 or limits.max_lines < 1:
            raise ValueError("ShellOutputLimits needs max_bytes >= 4 and max_lines >= 1")
        if limits.retain not in ("tail", "head"):
            raise ValueError(f"ShellOutputLimits.retain must be 'tail' or 'head': {limits.retain!r}")
        self.limits = limits
        #: Absolute (``details.spillPath`` is an absolute path: PROTOCOL.md §3.2).
        self.log_path = os.path.abspath(os.fspath(log_path)) if log_path is not None else None
        self.spill_path: str | None = None
        self.text: str = ""
        self.offset: int = 0
        self.read_offset: int = 0
        self.version: int = 0
        self.finished = False
        self.dropped_bytes = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._total_bytes = 0
        self._total_lines_ = 0
        self._window_newlines = 0  # "\n" in text
        self._window_bytes = 0  # UTF-8 bytes of text
        self._truncated = False
        self._edge = ""  # the cleaned character just outside the window
        self._closed = False  # head mode: the window refused a character; nothing more enters

    # -- input ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Head mode: the window is full; later bytes cannot change it."""
        return self._closed

    def feed(self, data: bytes) -> None:
        """Take the log's next raw chunk: decode/clean it into the window."""
        if self.finished:
            raise RuntimeError("OutputCapture.feed after finish")
        if not data:
            return
        self.read_offset += len(data)
        if not self._closed:
            if data.isascii() and not self._decoder.getstate()[0]:
                # Nothing pending in the decoder and nothing to decode: clean the raw bytes
                # (the same text as decode + clean_text, without the encode round trip).
                text = data.translate(None, _DROPPED_CONTROLS).decode("ascii")
            else:
                text = clean_text(self._decoder.decode(data))
            if text:
                self._push(text)
        self._maybe_spill()
        self.version += 1

    def rebuild(self, tail: bytes, *, start: int, lost: bool) -> bool:
        """Jump: make the window that of the stream whose last raw bytes are ``tail`` (the log
        from byte ``start`` on) and set :attr:`read_offset` past it. True when done: the
        cleaned tail (decoded from its first byte that is not a UTF-8 continuation byte)
        overflows the window's limits, or ``lost`` (``tail`` starts at the oldest retained
        byte, after bytes between the read offset and it were dropped: the window is marked
        truncated). False, nothing changed: the tail is too short; read more of it."""
        if self.finished:
            raise RuntimeError("OutputCapture.rebuild after finish")
        sync = 0
        while sync < len(tail) and tail[sync] & 0xC0 == 0x80:
            sync += 1
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = clean_text(decoder.decode(tail[sync:]))
        nbytes = _utf8_len(text)
        lines = text.count("\n") + (1 if text and text[-1] != "\n" else 0)
        if not lost and nbytes <= self.limits.max_bytes and lines <= self.limits.max_lines:
            return False
        self.offset += len(self.text)
        self.text, self._window_newlines, self._window_bytes, self._edge = "", 0, 0, ""
        self._truncated = self._closed = False
        self._decoder = decoder
        self.read_offset = start + len(tail)
        if text:
            self._push(text)
        self._truncated = True
        self._maybe_spill()
        self.version += 1
        return True

    def set_totals(self, total_bytes: int, total_lines: int, dropped_bytes: int = 0) -> None:
        """The host's totals (its progress event or exit record)."""
        if (total_bytes, total_lines, dropped_bytes) == (
                self._total_bytes, self._total_lines_, self.dropped_bytes):
            return
        self._total_bytes, self._total_lines_ = total_bytes, total_lines
        self.dropped_bytes = dropped_bytes
        self._maybe_spill()
        self.version += 1

    def finish(self) -> None:
        """End of stream: flush the decoder (a trailing partial character -> U+FFFD). Idempotent."""
        if self.finished:
            return
        self.finished = True
        if not self._closed:
            text = clean_text(self._decoder.decode(b"", final=True))
            if text:
                self._push(text)
        self._maybe_spill()
        self.version += 1

    # -- output --------------------------------------------------------------------------

    @property
    def truncation(self) -> dict:
        """``{"truncated","truncatedBy","totalBytes","totalLines","maxBytes","maxLines"}``,
        plus ``"droppedBytes"`` when the log dropped bytes (its ``firstOffset`` > 0)."""
        value = {
            "truncated": self._truncated,
            "truncatedBy": self._truncated_by(),
            "totalBytes": self._total_bytes,
            "totalLines": self._total_lines_,
            "maxBytes": self.limits.max_bytes,
            "maxLines": self.limits.max_lines,
        }
        if self.dropped_bytes:
            value["droppedBytes"] = self.dropped_bytes
        return value

    def tool_output(self) -> dict:
        """The ToolOutput value (PROTOCOL.md §3.3): content, details (spillPath?), truncation."""
        details: dict = {}
        if self.spill_path is not None:
            details["spillPath"] = self.spill_path
        return {
            "content": [{"type": "text", "text": self.text}],
            "details": details,
            "truncation": self.truncation,
        }

    def statistics(self) -> dict:
        """Sizes of what the capture holds, for tests and ``daemon.status``: ``windowChars``
        (characters of ``text``), ``decoderPending`` (bytes of an incomplete character)."""
        return {
            "windowChars": len(self.text),
            "decoderPending": len(self._decoder.getstate()[0]),
        }

    # -- internals -----------------------------------------------------------------------

    def _truncated_by(self) -> str | None:
        if not self._truncated:
            return None
        limit = self.limits.max_lines
        if self.limits.retain == "tail":
            # lines(edge + window): a "\n" edge adds one line to a non-empty window.
            if not self.text:
                with_edge = 1
            else:
                partial = 1 if self.text[-1] != "\n" else 0
                with_edge = self._window_newlines + partial + (1 if self._edge == "\n" else 0)
        else:
            # lines(window + edge) = newlines of the window + 1, whatever the edge is.
            with_edge = self._window_newlines + 1
        return "lines" if with_edge > limit else "bytes"

    def _maybe_spill(self) -> None:
        if self.spill_path is not None or self.log_path is None:
            return
        if (
            self._truncated
            or self._total_bytes > self.limits.max_bytes
            or self._total_lines_ > self.limits.max_lines
        ):
            self.spill_path = self.log_path

    def _push(self, text: str) -> None:
        if self.limits.retain == "tail":
            self._push_tail(text)
        else:
            self._push_head(text)

    def _push_tail(self, text: str) -> None:
        # Newline and byte counts are kept incrementally, so a small append to a full window
        # costs O(appended + dropped) in scans (plus one O(window) concatenation).
        max_bytes, max_lines = self.limits.max_bytes, self.limits.max_lines
        if len(text) > max_bytes:
            # A character is at least one byte: the window lies within the last max_bytes
            # characters of ``text``. The old window and the rest of ``text`` are cut whole,
            # unscanned, so a big read costs O(window) here, not O(read).
            skip = len(text) - max_bytes
            self.offset += len(self.text) + skip
            self._edge = text[skip - 1]
            self._truncated = True
            self.text, self._window_newlines, self._window_bytes = "", 0, 0
            text = text[skip:]
        whole = self.text + text
        newlines = self._window_newlines + text.count("\n")
        nbytes = self._window_bytes + _utf8_len(text)
        # A character is at least one byte, so the byte cut is never before len - max_bytes.
        cut = len(whole) - max_bytes if len(whole) > max_bytes else 0
        if cut:
            newlines -= whole.count("\n", 0, cut)
            nbytes -= _utf8_len(whole[:cut])
        window = whole[cut:] if cut else whole
        if nbytes > max_bytes:
            # Drop the fewest whole characters whose UTF-8 size reaches the excess; they are
            # among the first ``excess`` characters. max_bytes >= 4 keeps the last character.
            excess = nbytes - max_bytes
            front = window[:excess].encode()
            end = excess
            while end < len(front) and front[end] & 0xC0 == 0x80:
                end += 1
            dropped = len(front[:end].decode())
            newlines -= window.count("\n", 0, dropped)
            nbytes -= end
            cut += dropped
            window = window[dropped:]
        lines = newlines + (1 if window and window[-1] != "\n" else 0)
        if lines > max_lines:
            # Cut right after the ``drop``-th newline from the front, which is the
            # ``keep + 1``-th from the end. Find/split from the cheaper end (C speed).
            drop = lines - max_lines
            keep = newlines - drop
            if drop <= 16:
                start = -1
                for _ in range(drop):
                    start = window.find("\n", start + 1)
                start += 1
            elif drop <= keep:
                start = len(window) - len(window.split("\n", drop)[-1])
            else:
                start = len(window.rsplit("\n", keep + 1)[0]) + 1
            nbytes -= _utf8_len(window[:start])
            cut += start
            window = window[start:]
            newlines = keep
        if cut:
            self._edge = whole[cut - 1]
            self.offset += cut
            self._truncated = True
        self.text = window
        self._window_newlines = newlines
        self._window_bytes = nbytes

    def _push_head(self, text: str) -> None:
        # Until the window closes only appends happen; the cuts below run once, at closing.
        max_bytes, max_lines = self.limits.max_bytes, self.limits.max_lines
        whole = self.text + text
        newlines = self._window_newlines + text.count("\n")
        nbytes = self._window_bytes + _utf8_len(text)
        window = whole
        if nbytes > max_bytes:  # (len(whole) > max_bytes implies it)
            window = whole[:max_bytes]
            encoded = window.encode()
            if len(encoded) > max_bytes:
                # The input is valid UTF-8; "ignore" drops only the cut-off last character.
                window = encoded[:max_bytes].decode("utf-8", "ignore")
            newlines = window.count("\n")
            nbytes = _utf8_len(window)
        lines = newlines + (1 if window and window[-1] != "\n" else 0)
        if lines > max_lines:
            # Keep through the max_lines-th newline.
            window = window[: len(window) - len(window.split("\n", max_lines)[-1])]
            newlines = max_lines
            nbytes = _utf8_len(window)
        if len(window) < len(whole):
            self._edge = whole[len(window)]
            self._closed = True
            self._truncated = True
        self.text = window
        self._window_newlines = newlines
        self._window_bytes = nbytes


def _utf8_len(text: str) -> int:
    """UTF-8 size of ``text`` in bytes (O(1) for ASCII: CPython flags it)."""
    return len(text) if text.isascii() else len(text.encode())


Reader = Callable[[int, int], Awaitable[bytes]]


def jump_threshold(limits: ShellOutputLimits) -> int:
    """Unread bytes past which a tail-mode catch-up reads only the log's tail."""
    return 4 * limits.max_bytes + JUMP_SLACK


async def catch_up(capture: OutputCapture, reader: Reader, end: int, first: int,
                   total_lines: int, *, threshold: int | None = None) -> None:
    """Bring ``capture`` up to byte ``end`` of the log (module doc): totals from the host
    (``end`` bytes, ``total_lines``, ``first`` = the oldest retained byte), then the window by
    an incremental feed or, for a large gap in tail mode, a jump.

    ``reader(offset, limit)``: up to ``limit`` bytes of the log from ``offset`` (fewer only
    where the log ends); :class:`Gap` when ``offset`` is no longer retained. ``threshold``:
    the gap past which it jumps (default :func:`jump_threshold`)."""
    if threshold is None:
        threshold = jump_threshold(capture.limits)
    capture.set_totals(end, total_lines, first)
    while capture.read_offset < end and not capture.closed and not capture.finished:
        gap = end - capture.read_offset
        try:
            if capture.read_offset < first and capture.limits.retain == "head":
                capture.rebuild(b"", start=end, lost=True)  # the head is gone: none to show
                capture._closed = True
            elif capture.read_offset < first or (
                    capture.limits.retain == "tail" and gap > threshold):
                await _jump(capture, reader, end, first)
            else:
                data = await reader(capture.read_offset, min(gap, READ_PIECE))
                if not data:
                    return  # the log is shorter than reported (not flushed yet): next time
                capture.feed(data)
        except Gap as exc:
            first = max(first, exc.first_offset)
            capture.set_totals(end, total_lines, first)


#: The most a jump reads of the log's tail (bytes): memory and work per read stay bounded
#: whatever the output cleans to.
JUMP_MAX = 16 * 1024 * 1024

async def _jump(capture: OutputCapture, reader: Reader, end: int, first: int) -> None:
    """Read the log's tail, growing backwards, until the window can be rebuilt from it."""
    # Text that needs no cleaning overflows the window with max_bytes + a few raw bytes; more
    # is read only when cleaning removed some (doubling, so the reads total < 2x the last).
    # At most JUMP_MAX bytes are read: a tail that cleans to less than the window through all
    # of them (64 MiB of NULs) gives the window those bytes hold, never a read of the whole gap.
    span = capture.limits.max_bytes + 4096
    while True:
        span = min(span, JUMP_MAX)
        start = max(end - span, first, capture.read_offset)
        data = await reader(start, end - start)
        if start == capture.read_offset:
            capture.feed(data)
            return
        if capture.rebuild(data, start=start, lost=start == first or span == JUMP_MAX):
            return
        span *= 2
