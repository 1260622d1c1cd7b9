"""A call's complete output: the live window until the output outgrows it, then the spill file.

Theory of operation: dshd keeps only a window of each call's output (51,200 bytes / 2,000
lines by default) and, from the moment the output first outgrows it, writes every raw byte the
command wrote to the call's spill file (``details.spillPath``: an absolute path on this
machine, readable by the user; EXEC.md §2). A client that falls behind -- or a command faster
than the lane's flushes -- sees the window slide past text it never printed: ``CallOutput``
alone can only count what it missed. ``CompleteOutput`` wraps it and hands out every byte of
the output exactly once, in three modes:

- **live**: no spill path yet, so the window holds the whole output (it never cut anything:
  cutting starts the spill in the same step) and ``CallOutput``'s pieces are the output. When
  the output is followed from its first byte (``from_start``; ``dsh run``, and ``dsh attach``
  when the call had not spilled yet) the bytes handed out are kept -- at most a window's
  worth -- to check the switch.
- **switching**: the first view (or the result) that shows a spill path, *before* its text is
  handed out. The text shown at ``totalBytes`` T ends at raw offset E = T less the bytes of
  an incomplete UTF-8 character the daemon's decoder holds back (read from the file). Once
  the spill file holds T bytes the switch is checked against it: from the start, the bytes
  handed out must be ``spill[:E]`` as is, or as dshd cleans text (NUL and C0 controls gone,
  invalid UTF-8 replaced); for ``dsh attach`` that came after the call spilled (nothing handed
  out yet), the window must be ``spill[E - len(window):E]``. Equal: ``position``, the raw
  offset of the end of what was handed out, is known, and the output continues from the file.
  Not equal, unreadable, or given up on by the driver: back to live for good -- the pieces
  held meanwhile come out, and the driver's closing note tells what was not shown. A file this
  user may not read (``PermissionError``: a system-mode daemon keeps spill files root's) sets
  ``denied``, with no note of its own: the closing note says where the complete output is.
- **spill**: every byte comes from the file: ``spill[position:target]``, ``target`` being the
  last ``totalBytes`` seen (views, then the result). No text of the window is handed out any
  more, so nothing can come twice, and a window that slid past unprinted text loses nothing.
  The file may lag the view (dshd writes it from its own task, a few MiB behind at most):
  ``behind`` says the driver should call ``take()`` again a little later. After
  ``finish(result)`` (dshd has written and closed the file by then), reaching the result's
  ``totalBytes`` means exactly the bytes the command wrote were handed out. A read error goes
  back to live from the next view on (the bytes in between are counted as not shown).

Raw bytes in spill mode are what the command wrote, byte for byte (the window's text is
cleaned of NUL and C0 controls and has invalid UTF-8 replaced; for clean UTF-8 both agree).
Pure but for the ``Spill`` it opens (``SpillFile`` reads the real file): the driver
(``client.cli.output``) decides when to poll and when to give up waiting.
"""

from __future__ import annotations

import codecs
import os
from typing import Any, Callable, Protocol, Sequence

from client.follow import CallOutput
from protocol.lane import ToolResult

__all__ = ["CompleteOutput", "Spill", "SpillFile", "command_ran", "incomplete_utf8_tail",
           "TAKE_CHUNK"]

#: The most ``take()`` hands out at once.
TAKE_CHUNK = 1 << 20
#: The most bytes kept to check a switch from the start (a window is 51,200 bytes by default).
CHECK_KEEP = 1 << 20
#: What dshd deletes from the retained text: NUL and the C0 controls but \t, \n, ESC (EXEC.md §2).
_DROPPED_CONTROLS = bytes(b for b in range(0x20) if b not in (0x09, 0x0A, 0x1B))

LIVE, SWITCHING, SPILL, FALLBACK = "live", "switching", "spill", "fallback"


class Spill(Protocol):
    """Read access to one spill file."""

    def size(self) -> int | None:
        """Bytes in the file now; None while it does not exist. ``OSError`` when unreadable."""

    def read(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset``. ``OSError`` when unreadable."""

    def close(self) -> None: ...


class SpillFile:
    """The spill file at ``path``, opened on first use (read-only, no symlinks) and kept open:
    a file the daemon deletes meanwhile stays readable."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def _open(self) -> int | None:
        if self._fd is None:
            if not os.path.isabs(self.path):
                raise OSError(f"not an absolute path: {self.path}")
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except FileNotFoundError:
                return None  # the daemon creates it on its first flush
        return self._fd

    def size(self) -> int | None:
        fd = self._open()
        return None if fd is None else os.fstat(fd).st_size

    def read(self, offset: int, n: int) -> bytes:
        fd = self._open()
        if fd is None:
            raise FileNotFoundError(2, "No such file or directory", self.path)
        return os.pread(fd, n, offset)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def incomplete_utf8_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` a UTF-8 decoder holds back, waiting for the rest
    of a character (0 to 3) -- as dshd's decoder (``errors="replace"``) does.

    A decoder meets the last non-continuation byte at a character boundary (a lead byte never
    continues a sequence), so decoding from there alone tells; a held-back sequence is at most
    3 bytes, so only the last 3 bytes matter.
    """
    for i in range(1, min(3, len(data)) + 1):
        if data[-i] & 0xC0 != 0x80:
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            decoder.decode(data[-i:])
            return len(decoder.getstate()[0])
    return 0


def cleaned(raw: bytes) -> bytes:
    """What dshd's window makes of complete raw output: invalid UTF-8 replaced (U+FFFD), NUL
    and C0 controls other than \\t, \\n, ESC deleted (EXEC.md §2), as UTF-8."""
    return raw.decode("utf-8", "replace").encode("utf-8").translate(None, _DROPPED_CONTROLS)


def _get(value: Any, *path: str) -> Any:
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def command_ran(result: ToolResult) -> bool:
    """True when a ToolResult's command started, so its ``content`` is output (else it is the
    sentence of a call that never ran). Every result the session builds has
    ``details.truncation`` (zeros when the command never ran), so its presence says nothing: a
    started command has an ``exitCode``, a ``message`` next to its output, or output
    (``totalBytes`` > 0)."""
    details = result.details
    if result.exit_code is not None or details.exit_code is not None:
        return True
    if result.message is not None:
        return True
    return details.truncation is not None and details.truncation.total_bytes > 0


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "replace")


class CompleteOutput:
    """One call's output, every byte once (see the module doc).

    ``update(ops, view)`` after each lane batch, ``finish(result)`` with the ToolResult, and
    ``take()`` until it returns ``b""`` after each of them; while ``behind``, call ``take()``
    again later. ``notes`` collects lines for stderr. ``opener`` None: live only (the old
    behaviour). ``from_start``: the output is followed from its first byte (``dsh run``);
    False: from the window first seen, whatever it is (``dsh attach``; decided at first sight:
    from the start when the call had not spilled yet).
    """

    def __init__(self, call_id: str, opener: Callable[[str], Spill] | None = SpillFile, *,
                 from_start: bool = True) -> None:
        self.call_id = call_id
        self.watcher = CallOutput(call_id)
        self.opener = opener
        #: True: from byte 0; None: not decided yet (attach); False: unknown origin.
        self.from_start: bool | None = True if from_start else None
        self.mode = LIVE
        self.spill_path: str | None = None
        #: Raw offset of the end of what was handed out (spill mode).
        self.position = 0
        #: Raw offset from which the output comes from the spill file (once it does).
        self.switched_at: int | None = None
        #: Raw offset where the output handed out starts, when known.
        self.start: int | None = 0 if from_start else None
        #: The last totalBytes seen; the result's after ``finish``.
        self.target = 0
        self.total: int | None = None
        self.truncated = False
        #: Bytes handed out by ``take`` (raw bytes of the output once in spill mode).
        self.printed = 0
        self.finished = False
        self.notes: list[str] = []
        self._ready: list[bytes] = []
        self._held: list[bytes] = []
        self._live = bytearray()  # handed out live from the start (to check the switch)
        self._live_total = 0  # totalBytes of the window the live output ends with
        self._check: tuple[str, int, bytes] | None = None  # (kind, totalBytes, expected bytes)
        self._spill: Spill | None = None
        #: The spill file exists but this user may not read it (a system-mode daemon's).
        self.denied = False

    # -- state ---------------------------------------------------------------------------
    @property
    def settled(self) -> bool:
        return self.watcher.settled

    @property
    def switching(self) -> bool:
        return self.mode == SWITCHING

    @property
    def behind(self) -> bool:
        """Output is known to exist that the spill file does not hold yet (or the switch waits
        for it): call ``take()`` again later."""
        return bool(self._ready) or self.mode == SWITCHING or (
            self.mode == SPILL and self.position < self.target)

    def unshown(self) -> int:
        """Bytes of the output known not to have been handed out (0 when not known)."""
        if self.total is None:
            return 0
        if self.mode == SPILL:
            return max(0, self.total - self.position)
        if self.mode == LIVE and not self.truncated:
            return 0  # the window held it all (a shortfall is what the daemon cleaned)
        return max(0, self.total - (self.start or 0) - self.printed)

    # -- input ---------------------------------------------------------------------------
    def update(self, ops: Sequence[Sequence[Any]], view: Any) -> None:
        piece = self.watcher.update(ops, view)
        call = _get(view, "tools")
        call = call.get(self.call_id) if isinstance(call, dict) else None
        output = _get(call, "output")
        if not isinstance(output, dict):
            self._step(piece, None, None, None, None)
            return
        text = output.get("content")
        text = text[0].get("text") if isinstance(text, list) and text and isinstance(
            text[0], dict) else None
        self._step(piece, _int(_get(output, "truncation", "totalBytes")),
                   _get(output, "details", "spillPath"),
                   _get(output, "truncation", "truncated"), text if isinstance(text, str) else "")

    def finish(self, result: ToolResult) -> None:
        """The call settled with ``result`` (its ToolResult)."""
        self.finished = True
        if not command_ran(result):
            return  # never ran: its content is a sentence, not output
        truncation = result.details.truncation
        total = truncation.total_bytes if truncation is not None else None
        piece = self.watcher.finish(result.content, total,
                                    truncation.truncated if truncation is not None else None)
        self._step(piece, total, result.details.spill_path,
                   truncation.truncated if truncation is not None else None, result.content)

    def _step(self, piece: str, total: int | None, spill_path: Any, truncated: Any,
              text: str | None) -> None:
        data = _encode(piece) if piece else b""
        if total is not None:
            self.total = total
            self.target = max(self.target, total)
        if truncated is True:
            self.truncated = True
        if not isinstance(spill_path, str) or not spill_path:
            spill_path = None
        if self.mode == LIVE and self.from_start is None and text is not None:
            # First sight (attach): an output that never spilled is all in the window.
            if spill_path is None:
                self.from_start = truncated is not True
                self.start = 0 if self.from_start else None
            elif self.opener is not None and total is not None:
                self._begin(spill_path, ("window", total, _encode(text)))
            else:
                self.from_start = False
        elif self.mode == LIVE and spill_path is not None and self.opener is not None \
                and self.from_start:
            if len(self._live) > CHECK_KEEP:
                self.opener = None  # cannot be checked (never happens: the window is smaller)
            else:
                self._begin(spill_path, ("start", self._live_total, bytes(self._live)))
        if self.mode == LIVE:
            if self.from_start and self.opener is not None:
                self._live += data
                if text is not None and total is not None:
                    self._live_total = total
            self._ready.append(data)
        elif self.mode == SWITCHING:
            self._held.append(data)
        elif self.mode == FALLBACK:
            self._ready.append(data)
        # SPILL: the window's text is not needed, the file has it all.

    def _begin(self, path: str, check: tuple[str, int, bytes]) -> None:
        self.mode = SWITCHING
        self.spill_path = path
        self._check = check

    # -- output --------------------------------------------------------------------------
    def take(self, limit: int = TAKE_CHUNK) -> bytes:
        """The next bytes to print, in order; ``b""`` when there is nothing right now."""
        if not self._ready and self.mode == SWITCHING:
            self._try_switch()
        if self._ready:
            data = b"".join(self._ready)
            self._ready.clear()
        elif self.mode == SPILL:
            data = self._copy(limit)
        else:
            data = b""
        self.printed += len(data)
        return data

    def give_up(self) -> None:
        """Stop waiting for the spill file: a switch that did not happen yet goes back to live
        (what it held comes out); in spill mode what is missing stays missing."""
        if self.mode == SWITCHING:
            self._abandon(f"dsh: the spill file {self.spill_path} did not show the output in "
                          "time; following the live window")

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    def _try_switch(self) -> None:
        assert self._check is not None and self.spill_path is not None and self.opener
        kind, at, expect = self._check
        try:
            if self._spill is None:
                self._spill = self.opener(self.spill_path)
            size = self._spill.size()
            if size is None or size < at:
                return  # not flushed that far yet
            # The text shown at totalBytes ``at`` ends before the bytes of a character that is
            # not complete yet (the daemon's decoder holds them back).
            end = at - incomplete_utf8_tail(self._spill.read(max(0, at - 3), min(at, 3)))
            if kind == "start":
                # All of the raw output up to ``end`` was shown: as is, or as dshd cleaned it.
                begin = 0
                raw = self._read_exact(0, end)
                ok = len(raw) == end and (raw == expect or cleaned(raw) == expect)
            else:  # the window, as is, right before ``end``
                begin = end - len(expect)
                ok = begin >= 0 and self._read_exact(begin, len(expect)) == expect
        except PermissionError:
            # System mode: the file is root's (0600 under 0700 directories). Not an error of
            # this call: follow the window; the driver's closing note says where the rest is.
            self.denied = True
            self._abandon(None)
            return
        except OSError as exc:
            self._abandon(f"dsh: cannot read the spill file {self.spill_path}: "
                          f"{exc.strerror or exc}")
            return
        if not ok:
            self._abandon(None)  # the window is not the raw output (cleaned): stay live
            return
        self.mode = SPILL
        # From the start, go on after what was shown; the window is shown from the file.
        self.position = self.switched_at = end if kind == "start" else begin
        self.start = begin
        self.printed = self.position - begin  # counted in raw bytes from now on
        self._held.clear()
        self._check = None

    def _read_exact(self, offset: int, n: int) -> bytes:
        assert self._spill is not None
        parts, got = [], 0
        while got < n:
            part = self._spill.read(offset + got, min(n - got, TAKE_CHUNK))
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def _abandon(self, note: str | None) -> None:
        if note:
            self.notes.append(note)
        self.mode = LIVE
        self.opener = None  # never again for this call
        if self._check is not None and self._check[0] == "window":
            self.from_start = False
            self.start = None
        self._check = None
        self._ready.extend(self._held)
        self._held.clear()
        self.close()

    def _copy(self, limit: int) -> bytes:
        assert self._spill is not None
        try:
            size = self._spill.size()
            if size is None or size < self.position:
                raise OSError("the spill file shrank")
            end = min(self.target, size)
            if end <= self.position:
                return b""
            data = self._spill.read(self.position, min(end - self.position, limit))
            if not data:
                raise OSError("the spill file ended early")
        except OSError as exc:
            self.notes.append(f"dsh: cannot read the spill file {self.spill_path}: "
                              f"{exc.strerror or exc}; following the live window")
            self.mode = FALLBACK
            # What was handed out so far, in the terms ``unshown`` uses.
            self.printed = self.position - (self.start or 0)
            self.close()
            return b""
        self.position += len(data)
        return data
