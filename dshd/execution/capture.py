"""Output capture at the source: the retained window, its totals, and the spill (EXEC.md §2).

Theory of operation
-------------------
One :class:`OutputCapture` per tool call. The process runner reads raw bytes from the call's
single output pipe (stdout and stderr merged) and hands every chunk to :meth:`OutputCapture.feed`;
at end of stream it calls :meth:`OutputCapture.finish`. :class:`OutputCapture` itself is pure
and synchronous: no clock, no trio, no file I/O; the only way bytes leave it is the
:class:`SpillSink` it was given, into which it only *buffers*. The sink (below) is this
module's one part that writes files: the runner's spill writer task drains its buffer with
:meth:`SpillSink.flush` (in a worker thread) while the reader goes on reading, and the reader
waits only once the buffer passes a high-water mark (:mod:`dshd.execution.process`).

Each chunk goes through three stages:

1. **Totals** on the raw bytes: ``totalBytes`` is every byte the command wrote; ``totalLines``
   is the number of ``\\n`` bytes plus one for a final line without ``\\n`` (counted live, so
   the figure is already right before :meth:`finish`).
2. **Decode and clean**: an incremental UTF-8 decoder (``errors="replace"``) keeps a character
   split across reads whole and turns invalid bytes into U+FFFD; then NUL and the C0 controls
   other than ``\\t``, ``\\n`` and ESC are deleted. Cleaning works on the re-encoded, already
   valid UTF-8, where a control byte can never sit inside a multi-byte character, so deleting
   bytes is exact (an order of magnitude faster than ``str.translate`` on non-ASCII text).
3. **Window**: the cleaned text is appended to the retained window and the window is cut back to
   ``max_bytes`` UTF-8 bytes and ``max_lines`` lines. ``retain="tail"`` keeps the longest suffix
   within both limits (a line longer than ``max_bytes`` keeps its UTF-8-safe end);
   ``retain="head"`` keeps the longest prefix and, once something was cut, ignores everything
   after it. Both limits are monotone over suffixes (prefixes), so cutting ``window + new``
   gives exactly the window of the whole cleaned stream: the result does not depend on how the
   bytes were chunked, and memory is O(window + one chunk).

A line, in the window as in the totals, is a ``\\n``-terminated run or a final unterminated run:
``lines(s) = s.count("\\n") + (1 if s and not s.endswith("\\n") else 0)``.

``truncated`` says the window dropped some cleaned text. ``truncatedBy`` names the limit that
decides the window's edge: with ``c`` the character just outside the window (the last one
dropped in tail mode, the first one refused in head mode), it is ``"lines"`` when ``c`` plus the
window would exceed ``max_lines``, else ``"bytes"``. Like the window, it is a function of the
whole cleaned stream only. Output that is dropped by cleaning (a megabyte of NULs) is not
truncation: the text is complete, the totals and the spill show the rest.

Spill: with a sink, the capture keeps the raw bytes it has seen until the output first exceeds
the window — ``totalBytes > max_bytes``, ``totalLines > max_lines``, or the window cut something
(invalid bytes grow threefold as U+FFFD, so the last can happen first). At that moment the kept
bytes go to the sink in one piece, :attr:`spill_path` is set, and every later raw chunk is
passed to the sink as it arrives. The kept raw bytes therefore never exceed
``max_bytes`` + one chunk. Without a sink nothing raw is kept.

:attr:`version` bumps on every change (new bytes, the final flush); a publisher polls it and
reads :attr:`text`, :attr:`offset` and :attr:`truncation`. ``offset`` counts the cleaned
characters dropped before the window (tail mode), so a publisher holding an older
``(offset, text)`` can tell a slide (drop ``offset' - offset`` characters, append the rest) from
a complete turnover.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import Literal

import msgspec
import trio

from dshd.paths import is_valid_id

__all__ = ["OutputCapture", "ShellOutputLimits", "SpillSink", "clean_text"]

#: C0 controls deleted from the retained text: everything below 0x20 except \t, \n and ESC.
_DROPPED_CONTROLS = bytes(b for b in range(0x20) if b not in (0x09, 0x0A, 0x1B))


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


class SpillSink:
    """Owner of one spill file ``<session_dir>/spill/<callId>.log`` (EXEC.md §2).

    :meth:`write` only buffers (sync, no I/O; safe from the capture). :meth:`flush` writes the
    buffer in a worker thread (``trio.to_thread.run_sync``) so a slow disk never stalls the trio
    thread; :meth:`flush_sync` is the same in the calling thread (tests, tools without trio).
    The file and the ``spill`` directory are created on the first flush, file mode 0600 and
    directory mode 0700 (the directory is created only if missing; the session directory must
    exist). The file is opened ``O_TRUNC | O_NOFOLLOW``.

    Errors: a failed open or write raises :class:`OSError` from the flush and is kept in
    :attr:`error`; afterwards :meth:`write` discards data and flushes are no-ops — the caller
    must fail the call (the runner does: EXEC.md §2, never a silent loss).

    Thread use: only one flush may run at a time (the runner has one spill writer task).
    :meth:`write` and the start of :meth:`flush` run in the trio thread, and a flush takes the
    buffered chunks before its worker starts, so the capture may go on buffering while the
    worker writes (the runner overlaps reading with spilling); :meth:`flush_sync` must not run
    while a :meth:`flush` is in flight.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        #: Absolute (``details.spillPath`` is an absolute path: PROTOCOL.md §3.2).
        self.path: str = os.path.abspath(os.fspath(path))
        self.error: OSError | None = None
        #: Bytes written to the file so far.
        self.written: int = 0
        self._chunks: list[bytes | bytearray] = []
        self._pending: int = 0
        self._fd: int | None = None
        self._closed = False

    @classmethod
    def for_call(cls, session_dir: str | os.PathLike[str], call_id: str) -> SpillSink:
        """The sink of call ``call_id`` in ``session_dir``; ``ValueError`` for an invalid id."""
        if not is_valid_id(call_id):
            raise ValueError(f"invalid call id for a spill file: {call_id!r}")
        return cls(Path(session_dir) / "spill" / f"{call_id}.log")

    @property
    def pending(self) -> int:
        """Bytes buffered and not yet written."""
        return self._pending

    def write(self, data: bytes | bytearray) -> None:
        """Buffer ``data`` (the sink takes ownership; do not mutate it afterwards)."""
        if self.error is not None or self._closed or not data:
            return
        self._chunks.append(data)
        self._pending += len(data)

    def flush_sync(self) -> None:
        """Write every buffered byte now, in this thread. Raises ``OSError`` (kept in ``error``)."""
        if self.error is not None or not self._chunks:
            return
        chunks, self._chunks = self._chunks, []
        size = sum(len(c) for c in chunks)
        try:
            self._write_chunks(chunks)
        except OSError:
            self._pending = 0
            raise
        self._pending -= size

    async def flush(self) -> None:
        """Write every buffered byte in a worker thread. Raises ``OSError`` (kept in ``error``).

        The chunks are taken here, in the trio thread, so :meth:`write` may go on buffering
        while the worker writes (the runner overlaps reading with spilling).
        """
        if self.error is not None or not self._chunks:
            return
        chunks, self._chunks = self._chunks, []
        size = sum(len(c) for c in chunks)
        try:
            await trio.to_thread.run_sync(self._write_chunks, chunks)
        except OSError:
            self._pending = 0
            raise
        except BaseException:
            # Cancelled before the worker started (a started worker is waited for): nothing
            # was written; keep the chunks, in order, for the next flush.
            self._chunks[:0] = chunks
            raise
        self._pending -= size

    def _write_chunks(self, chunks: list) -> None:
        """Write ``chunks`` in order (the worker-thread half of :meth:`flush`, and all of
        :meth:`flush_sync`): touches only the file, never the buffer."""
        try:
            if self._fd is None:
                self._fd = self._open()
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    n = os.write(self._fd, view)
                    view = view[n:]
                    self.written += n
        except OSError as exc:
            self.error = exc
            raise

    def close(self) -> None:
        """Close the file (buffered bytes not flushed are dropped). Idempotent."""
        self._closed = True
        self._chunks = []
        self._pending = 0
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _open(self) -> int:
        directory = os.path.dirname(self.path)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(directory, 0o700)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self.path, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)
        except OSError:
            os.close(fd)
            raise
        return fd


class OutputCapture:
    """The retained window and totals of one call's output (EXEC.md §2; see the module doc).

    ``feed(data)`` takes raw bytes as read from the pipe; ``finish()`` ends the stream (a
    trailing partial character becomes U+FFFD); feeding after ``finish()`` is a
    ``RuntimeError``. ``ValueError`` for limits below ``max_bytes=4`` / ``max_lines=1``.

    Attributes: ``text`` (the window), ``offset`` (cleaned characters dropped before it, tail
    mode), ``spill`` (the sink or None), ``spill_path`` (set once spilling started),
    ``version`` (bumps on every change), ``finished``.
    """

    def __init__(self, limits: ShellOutputLimits, spill: SpillSink | None) -> None:
        if limits.max_bytes < 4 or limits.max_lines < 1:
            raise ValueError("ShellOutputLimits needs max_bytes >= 4 and max_lines >= 1")
        if limits.retain not in ("tail", "head"):
            raise ValueError(f"ShellOutputLimits.retain must be 'tail' or 'head': {limits.retain!r}")
        self.limits = limits
        self.spill = spill
        self.spill_path: str | None = None
        self.text: str = ""
        self.offset: int = 0
        self.version: int = 0
        self.finished = False
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._total_bytes = 0
        self._newlines = 0
        self._ends_with_newline = False
        self._window_newlines = 0  # "\n" in text
        self._window_bytes = 0  # UTF-8 bytes of text
        self._truncated = False
        self._edge = ""  # the cleaned character just outside the window
        self._closed = False  # head mode: the window refused a character; nothing more enters
        # Raw bytes kept until the output first exceeds the window (only with a sink).
        self._raw: bytearray | None = bytearray() if spill is not None else None

    # -- input ---------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Take one raw chunk: count it, spill it if spilling, decode/clean it into the window."""
        if self.finished:
            raise RuntimeError("OutputCapture.feed after finish")
        if not data:
            return
        self._total_bytes += len(data)
        self._newlines += data.count(b"\n")
        self._ends_with_newline = data[-1] == 0x0A
        if self.spill_path is not None:
            assert self.spill is not None
            self.spill.write(bytes(data))
        elif self._raw is not None:
            self._raw += data
        if not self._closed:
            if data.isascii() and not self._decoder.getstate()[0]:
                # Nothing pending in the decoder and nothing to decode: clean the raw bytes
                # (the same text as decode + clean_text, without the encode round trip).
                text = data.translate(None, _DROPPED_CONTROLS).decode("ascii")
            else:
                text = clean_text(self._decoder.decode(data))
            if text:
                self._push(text)
        self._maybe_start_spill()
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
        self._maybe_start_spill()
        self._raw = None
        self.version += 1

    # -- output --------------------------------------------------------------------------

    @property
    def truncation(self) -> dict:
        """``{"truncated","truncatedBy","totalBytes","totalLines","maxBytes","maxLines"}``.

        Totals are raw: bytes written, and ``\\n`` count plus a final unterminated line.
        """
        return {
            "truncated": self._truncated,
            "truncatedBy": self._truncated_by(),
            "totalBytes": self._total_bytes,
            "totalLines": self._total_lines(),
            "maxBytes": self.limits.max_bytes,
            "maxLines": self.limits.max_lines,
        }

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
        """Sizes of what the capture holds, for tests and ``daemon.status``.

        ``windowChars`` (characters of ``text``), ``rawBuffered`` (bytes kept before spilling),
        ``decoderPending`` (bytes of an incomplete character), ``spillPending`` (bytes buffered
        in the sink, not yet written).
        """
        return {
            "windowChars": len(self.text),
            "rawBuffered": len(self._raw) if self._raw is not None else 0,
            "decoderPending": len(self._decoder.getstate()[0]),
            "spillPending": self.spill.pending if self.spill is not None else 0,
        }

    # -- internals -----------------------------------------------------------------------

    def _total_lines(self) -> int:
        unterminated = self._total_bytes and not self._ends_with_newline
        return self._newlines + (1 if unterminated else 0)

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

    def _maybe_start_spill(self) -> None:
        if self._raw is None or self.spill_path is not None or self.spill is None:
            return
        if (
            self._truncated
            or self._total_bytes > self.limits.max_bytes
            or self._total_lines() > self.limits.max_lines
        ):
            raw, self._raw = self._raw, None
            self.spill.write(raw)
            self.spill_path = self.spill.path

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
