"""NDJSON line framing, sans-IO (PROTOCOL.md §1): bytes in, complete lines out.

Theory of operation: a :class:`LineBuffer` is fed the bytes a stream delivered
(:meth:`LineBuffer.feed`) and then asked for events until it needs more
(:meth:`LineBuffer.next_event` returns :data:`NEED_DATA`). It does no I/O, so the daemon's
connection (trio) and the client (anyio) frame the same way with the same code; what each
does with an event is its own policy.

* **A line** is the bytes before a ``\\n`` (the newline is not part of it). A line that is
  empty or only whitespace is skipped: NDJSON peers may send blank lines between messages.
  A line wholly inside one fed chunk is handed out as a slice of it, never copied into the
  buffer; only the unfinished tail of a chunk is buffered.
* **The oversize rule, one for both sides.** A line longer than ``max_line_bytes`` is never
  buffered past the limit: the buffer drops what it holds of it the moment it would pass, and
  discards every further byte through its newline. When that newline arrives the buffer reports
  :class:`Oversize` once, in the line's place, and goes on with the next line. The daemon
  answers it ``-32600`` and keeps the connection (the peer may go on); the client treats a daemon
  that breaks its own limit as broken and closes (:attr:`LineBuffer.discarding` lets a consumer
  act before the newline arrives, as a client does).
* **The line budget hook.** Bytes of unfinished lines may be counted against a budget shared by
  many buffers (the daemon's ``max_buffered_bytes`` over all connections): each byte is taken
  from ``budget`` (:class:`Budget`) as it is buffered and given back when its line has been
  handled (the next call to :meth:`next_event`), dropped as oversize, or the buffer is
  :meth:`closed <LineBuffer.close>`. When the budget refuses bytes the buffer reports
  :class:`OverBudget` and is finished: every later call returns :data:`NEED_DATA`. A line handed
  out as a slice of its chunk costs no budget. No budget (``None``): only the oversize rule
  bounds memory.
"""

from __future__ import annotations

from typing import Final, Protocol

__all__ = ["Budget", "LineBuffer", "NEED_DATA", "NeedData", "Oversize", "OverBudget"]


class Budget(Protocol):
    """Bytes that many line buffers buffer together (the daemon's ``LineBudget``)."""

    def take(self, n: int) -> bool:
        """Count ``n`` more bytes; False (and nothing counted) when that would pass the limit."""

    def give(self, n: int) -> None:
        """Give back ``n`` bytes taken earlier."""


class NeedData:
    """The buffer holds no complete line: feed it the next chunk."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()


class Oversize:
    """A line longer than ``limit`` bytes ended here; its bytes were discarded."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __repr__(self) -> str:
        return f"Oversize(limit={self.limit})"


class OverBudget:
    """Buffering ``wanted`` more bytes would pass the shared budget; the buffer is finished."""

    __slots__ = ("wanted",)

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted

    def __repr__(self) -> str:
        return f"OverBudget(wanted={self.wanted})"


Event = bytes | bytearray | Oversize | OverBudget | NeedData


class LineBuffer:
    """Split fed bytes into lines under the oversize rule and an optional shared budget."""

    def __init__(self, max_line_bytes: int, budget: Budget | None = None) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        self.max_line_bytes = max_line_bytes
        self._budget = budget
        self._chunk = b""  # the fed chunk not yet looked at, from _pos on
        self._pos = 0
        self._buf = bytearray()  # the unfinished line (every byte of it taken from the budget)
        self._handed = 0  # budget bytes of the last line handed out, given back on the next call
        self._discarding = False
        self._finished = False

    @property
    def discarding(self) -> bool:
        """True while the bytes of an oversize line are being discarded (before its newline)."""
        return self._discarding

    @property
    def held(self) -> int:
        """Budget bytes this buffer holds (the unfinished line, and the line being handled)."""
        return len(self._buf) + self._handed

    def feed(self, data: bytes) -> None:
        """Hand over the next chunk. Call it only after :meth:`next_event` said NEED_DATA."""
        if self._pos < len(self._chunk):
            raise RuntimeError("feed() before next_event() returned NEED_DATA")
        self._chunk, self._pos = bytes(data), 0

    def next_event(self) -> Event:
        """The next complete line, :class:`Oversize`, :class:`OverBudget`, or NEED_DATA."""
        if self._handed:
            self._give_handed()
        while not self._finished:
            chunk, start = self._chunk, self._pos
            nl = chunk.find(b"\n", start)
            if nl < 0:
                self._chunk, self._pos = b"", 0
                return self._keep_tail(chunk, start)
            self._pos = nl + 1
            if not self._buf and not self._discarding and nl - start <= self.max_line_bytes:
                line = chunk[start:nl]  # the common case: a whole line inside the chunk
                if line and not line.isspace():
                    return line
                continue
            event = self._end_line(chunk, start, nl)
            if event is not None:
                return event
        return NEED_DATA

    def close(self) -> None:
        """Give back every budget byte held; the buffer is finished."""
        self._give_handed()
        self._give(len(self._buf))
        self._buf = bytearray()
        self._chunk, self._pos = b"", 0
        self._finished = True

    # ----------------------------------------------------------------- internals
    def _keep_tail(self, chunk: bytes, start: int) -> Event:
        """Buffer the unfinished end of a chunk (or discard it, for an oversize line)."""
        n = len(chunk) - start
        if self._discarding or n == 0:
            return NEED_DATA
        if len(self._buf) + n > self.max_line_bytes:
            self._drop_oversize()
            return NEED_DATA
        if not self._take(n):
            return self._over_budget(n)
        self._buf += memoryview(chunk)[start:]
        return NEED_DATA

    def _end_line(self, chunk: bytes, start: int, nl: int) -> Event | None:
        """The line ending at ``chunk[nl]``: its event, or None for a skipped blank line."""
        n = nl - start
        if self._discarding:
            self._discarding = False
            return Oversize(self.max_line_bytes)
        if len(self._buf) + n > self.max_line_bytes:
            self._give(len(self._buf))
            self._buf = bytearray()
            return Oversize(self.max_line_bytes)
        if n and not self._take(n):
            return self._over_budget(n)
        line, self._buf = self._buf, bytearray()
        line += memoryview(chunk)[start:nl]
        if not line or line.isspace():
            self._give(len(line))
            return None
        self._handed = len(line)
        return line

    def _drop_oversize(self) -> None:
        self._give(len(self._buf))
        self._buf = bytearray()
        self._discarding = True

    def _over_budget(self, wanted: int) -> OverBudget:
        self.close()
        return OverBudget(wanted)

    def _take(self, n: int) -> bool:
        return self._budget is None or self._budget.take(n)

    def _give(self, n: int) -> None:
        if n and self._budget is not None:
            self._budget.give(n)

    def _give_handed(self) -> None:
        self._give(self._handed)
        self._handed = 0
