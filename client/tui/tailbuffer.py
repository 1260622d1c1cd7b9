"""The bounded window of a call's raw output that ``OutputView`` shows: lines at absolute offsets.

Theory of operation: a call's output is a byte stream at absolute offsets (HOST.md §6) that
may be a GiB long; a screen shows a few dozen lines of it. ``LineWindow`` holds one
contiguous stretch of it as complete lines -- each line's raw bytes (its ``\\n`` stripped)
with the offset it starts at -- plus the unfinished last line, and never more than
``MAX_WINDOW_LINES`` lines nor ``MAX_WINDOW_BYTES`` bytes: appending past a bound drops the
oldest lines (``append``: following the tail), prepending past it drops the newest
(``prepend``: scrolling back into older output read with ``tool.read``; the window then no
longer reaches the end of the stream, ``at_tail`` is false). A line longer than
``MAX_LINE_BYTES`` is cut there (at a UTF-8 character boundary) and goes on as the next line.

Bytes are split at ``\\n`` before they are decoded, and a newline byte never occurs inside
a UTF-8 sequence, so a character split across two chunks is whole again in its line;
decoding happens per line, only for the lines drawn (``text``), and the unfinished last line
is decoded incrementally (``codecs``' UTF-8 decoder, ``final=False``: a character still
incomplete is held back, not shown as U+FFFD). Data that does not start where the window
ends (a gap: the disk cap dropped bytes, or the view skipped a flood it could not keep up
with) restarts the window at the first line start after the gap. Pure: no I/O.
"""

from __future__ import annotations

import codecs
from bisect import bisect_left
from itertools import accumulate
from operator import add

__all__ = ["LineWindow", "MAX_WINDOW_BYTES", "MAX_WINDOW_LINES", "MAX_LINE_BYTES"]

#: The most bytes of output the window holds (its lines' raw bytes). 4 MiB is ~50k lines of
#: a build log, far more than anyone scrolls through by hand; older output is read again on
#: demand (``tool.read``), so memory stays flat however long the call runs.
MAX_WINDOW_BYTES = 4 * 1024 * 1024
#: The most lines the window holds (short lines cost a Python object each: this bounds that).
MAX_WINDOW_LINES = 20_000
#: The longest line kept as one line; longer ones are cut and go on as the next line.
MAX_LINE_BYTES = 64 * 1024


def _utf8_cut(data: bytes, at: int) -> int:
    """The largest cut <= ``at`` that does not fall inside a UTF-8 sequence (>= 1)."""
    cut = at
    while cut > 1 and (data[cut] & 0xC0) == 0x80 and at - cut < 4:
        cut -= 1
    return cut if cut > 0 else at


def decode_line(raw: bytes) -> str:
    """A complete line's text (invalid bytes as U+FFFD)."""
    return raw.decode("utf-8", "replace")


class LineWindow:
    """A contiguous stretch of the output as lines, bounded (module doc)."""

    def __init__(self, max_bytes: int = MAX_WINDOW_BYTES, max_lines: int = MAX_WINDOW_LINES,
                 max_line: int = MAX_LINE_BYTES) -> None:
        self.max_bytes, self.max_lines, self.max_line = max_bytes, max_lines, max_line
        self.lines: list[bytes] = []
        self.starts: list[int] = []  # the offset each line starts at
        self.partial = bytearray()  # the unfinished last line
        self.partial_start: int | None = None  # its offset; None: the window is empty
        self.line_bytes = 0  # the bytes of ``lines`` (with their newlines)
        #: The offset after the last byte held; None until the first data.
        self.end: int | None = None
        #: The window reaches the end of what was appended (false after scrolling back).
        self.at_tail = True

    # -- sizes ------------------------------------------------------------------------------
    @property
    def start(self) -> int | None:
        """The offset of the first byte held (None: empty)."""
        if self.starts:
            return self.starts[0]
        return self.partial_start if self.partial else self.end

    @property
    def held_bytes(self) -> int:
        return self.line_bytes + len(self.partial)

    def __len__(self) -> int:
        """Lines to draw: the complete ones, and the unfinished one when it has bytes."""
        return len(self.lines) + (1 if self.partial else 0)

    def text(self, index: int) -> str:
        """Line ``index`` (0 = the oldest held) decoded."""
        if index < len(self.lines):
            return decode_line(self.lines[index])
        return codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(self.partial),
                                                                       final=False)

    def line_offset(self, index: int) -> int:
        return self.starts[index] if index < len(self.starts) else (self.partial_start or 0)

    def clear(self, at: int | None = None) -> None:
        self.lines.clear()
        self.starts.clear()
        self.partial.clear()
        self.line_bytes = 0
        self.partial_start = at
        self.end = at
        self.at_tail = True

    # -- following the end ------------------------------------------------------------------
    def append(self, offset: int, data: bytes, *, line_start: bool = False) -> int:
        """Add ``data`` (starting at ``offset``) at the end; drop the oldest lines past a
        bound. Bytes before ``end`` are skipped (seen already); a start after ``end`` (or a
        first append not at a line start, ``line_start`` false) restarts the window at the
        first line start in ``data``. Returns how many lines were dropped at the front."""
        if self.end is not None and offset < self.end:
            data = data[self.end - offset:]
            offset = self.end
        if not data:
            return 0
        if len(data) > self.max_bytes:
            offset, data = self._newest(offset, data)  # all the window holds is in ``data``
            line_start = False
        if self.end is None or offset > self.end:
            if not line_start:
                newline = data.find(b"\n")
                if newline < 0:
                    self.clear(offset + len(data))
                    return 0
                offset, data = offset + newline + 1, data[newline + 1:]
            dropped = len(self.lines)
            self.clear(offset)
            if not data:
                return dropped
        else:
            dropped = 0
        self._extend(offset, data)
        return dropped + self._trim_front()

    def _newest(self, offset: int, data: bytes) -> tuple[int, bytes]:
        """The part of ``data`` the bounds keep (its last bytes, its last lines), as a
        stretch that starts after a gap: the window restarts at its first line start."""
        cut = max(0, len(data) - self.max_bytes)
        at = len(data)
        for _ in range(self.max_lines + 1):
            at = data.rfind(b"\n", cut, at)
            if at < 0:
                break
        if at >= 0:
            cut = max(cut, at)
        self.clear(None)
        return offset + cut, data[cut:]

    def _extend(self, offset: int, data: bytes) -> None:
        """Add ``data`` at ``end``, whole lines in bulk (a flood's chunk is thousands)."""
        if not self.partial:
            self.partial_start = offset
        pieces = data.split(b"\n")
        if len(pieces) > self.max_lines + 1:  # only the last lines can stay
            skipped = sum(map(len, pieces[:-self.max_lines - 1])) + len(pieces) - self.max_lines - 1
            self.clear(offset + skipped)
            offset, data, pieces = offset + skipped, data[skipped:], pieces[-self.max_lines - 1:]
            self.partial_start = offset
        self.end = offset + len(data)
        lengths = list(map(len, pieces))
        if len(pieces) == 1 or max(lengths) + len(self.partial) > self.max_line:
            for piece in pieces[:-1]:  # an over-long line is cut: line by line
                self._add_partial(piece)
                self._close_line(newline=True)
            self._add_partial(pieces[-1])
            return
        complete = pieces[:-1]
        del lengths[-1]
        if self.partial:
            complete[0] = bytes(self.partial) + complete[0]
            lengths[0] += len(self.partial)
        at = self.partial_start if self.partial_start is not None else offset
        # line i starts after the lines before it and their newlines (C-level loops only)
        starts = list(map(add, accumulate(lengths[:-1], initial=0),
                          range(at, at + len(complete))))
        self.lines.extend(complete)
        self.starts.extend(starts)
        self.line_bytes += sum(lengths) + len(complete)
        self.partial = bytearray(pieces[-1])
        self.partial_start = starts[-1] + len(complete[-1]) + 1

    def _add_partial(self, piece: bytes) -> None:
        while len(self.partial) + len(piece) > self.max_line:
            room = self.max_line - len(self.partial)
            joined = bytes(self.partial) + piece[:room + 4]
            cut = _utf8_cut(joined, self.max_line) - len(self.partial)
            self.partial += piece[:cut]
            piece = piece[cut:]
            self._close_line(newline=False)
        self.partial += piece

    def _close_line(self, *, newline: bool) -> None:
        start = self.partial_start if self.partial_start is not None else 0
        raw = bytes(self.partial)
        self.lines.append(raw)
        self.starts.append(start)
        size = len(raw) + (1 if newline else 0)
        self.line_bytes += size
        self.partial.clear()
        self.partial_start = start + size

    def _trim_front(self) -> int:
        """Drop the oldest lines past a bound, in bulk; how many."""
        count = len(self.lines)
        if not count:
            return 0
        drop = max(0, count - self.max_lines)
        over = self.held_bytes - self.max_bytes
        if over > 0:  # the first line starting at least ``over`` bytes later stays
            drop = max(drop, bisect_left(self.starts, self.starts[0] + over))
        drop = min(drop, count)
        if not drop:
            return 0
        first = self.starts[0]
        following = self.starts[drop] if drop < count else self.partial_start
        del self.lines[:drop], self.starts[:drop]
        self.line_bytes -= (following if following is not None else first) - first
        return drop

    # -- scrolling back ---------------------------------------------------------------------
    def prepend(self, offset: int, data: bytes, *, line_start: bool) -> int:
        """Put older output before the window: ``data`` at ``offset`` ends where the window
        starts. Its first line counts only when ``line_start`` (``offset`` begins a line:
        the oldest byte kept); otherwise the bytes up to its first newline are dropped.
        At most half of ``max_lines`` are put before (the newest of ``data``), so the lines
        shown so far stay; the newest lines past a bound drop out (then ``at_tail`` is
        false). Returns how many lines were put before."""
        start = self.start
        if start is None or offset + len(data) != start:
            raise ValueError(f"prepend of [{offset}, {offset + len(data)}) does not end at "
                             f"the window's start {start}")
        if not line_start:
            newline = data.find(b"\n")
            if newline < 0:
                return 0
            offset, data = offset + newline + 1, data[newline + 1:]
        older = LineWindow(self.max_bytes, self.max_lines, self.max_line)
        older.clear(offset)
        older._extend(offset, data)
        if older.partial:  # our first line is the rest of a line cut at MAX_LINE_BYTES
            older._close_line(newline=False)
        keep = max(1, self.max_lines // 2)  # so that the lines shown so far stay
        if len(older.lines) > keep:
            older.max_lines = keep
            older._trim_front()
        added = len(older.lines)
        self.lines[:0] = older.lines
        self.starts[:0] = older.starts
        self.line_bytes += older.line_bytes
        self._trim_back()
        return added

    def _trim_back(self) -> None:
        while len(self.lines) > 1 and (len(self.lines) + (1 if self.partial else 0)
                                       > self.max_lines or self.held_bytes > self.max_bytes):
            self.at_tail = False
            if self.partial:
                self.partial.clear()
                self.end = self.partial_start
                continue
            self.lines.pop()
            start = self.starts.pop()
            self.line_bytes -= (self.end or start) - start
            self.partial_start = self.end = start
