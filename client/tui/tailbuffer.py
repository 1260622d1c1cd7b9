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
from collections import deque

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
        self.lines: deque[bytes] = deque()
        self.starts: deque[int] = deque()  # the offset each line starts at
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

    def _extend(self, offset: int, data: bytes) -> None:
        if not self.partial:
            self.partial_start = offset
        pieces = data.split(b"\n")
        for piece in pieces[:-1]:
            self._add_partial(piece)
            self._close_line(newline=True)
        self._add_partial(pieces[-1])
        self.end = offset + len(data)

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
        dropped = 0
        while self.lines and (len(self.lines) > self.max_lines
                              or self.held_bytes > self.max_bytes):
            self._pop_front()
            dropped += 1
        return dropped

    def _pop_front(self) -> None:
        raw = self.lines.popleft()
        start = self.starts.popleft()
        following = self.starts[0] if self.starts else self.partial_start
        self.line_bytes -= (following - start) if following is not None else len(raw)

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
        while len(older.lines) > max(1, self.max_lines // 2):  # keep what is shown in view
            older._pop_front()
        added = len(older.lines)
        self.lines.extendleft(reversed(older.lines))
        self.starts.extendleft(reversed(older.starts))
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
