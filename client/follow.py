"""Print a call's output once: follow a rolling window and emit only what was not printed yet.

Theory of operation: the daemon keeps a *window* of each call's output (the retained text,
EXEC.md §2) and streams its changes; ``dsh`` prints a continuous stream. ``Follower`` keeps
the invariant "what was printed ends with ``window``" and turns each change into the text to
print next:

- ``append(text)`` (an ``a`` op): all of ``text`` is new;
- ``drop(n)`` (a ``t`` op, the first half of a window slide): nothing is new;
- ``resync(text)`` (anything else: a base batch after a resubscribe, a whole-text ``s``, the
  final result): the longest suffix of the old window that is a prefix of ``text`` was printed
  already, the rest is new. Repetitive output makes that overlap ambiguous; when the output's
  ``totalBytes`` is known before and after, the overlap whose new part has exactly the
  difference in bytes wins. Without a match the longest overlap wins: we would rather miss
  a repeated piece than print one twice. The totals count raw bytes, the text is cleaned
  (NUL and C0 controls dropped, invalid bytes made U+FFFD: EXEC.md §2), so a fit can be a
  coincidence; but a *complete* window (``truncation.truncated`` false: nothing was ever cut)
  is the whole cleaned output, and every earlier window was its start -- then the old window
  is a prefix of the new one and only the rest is new, whatever the totals say. A window
  that moved past text never seen (a flood between two publishes) cannot be helped here:
  ``CallOutput.printed_bytes`` against the final ``totalBytes`` tells how much was not shown.
  The spill file has it all: ``client.spill.CompleteOutput`` takes the output from there once
  it exists.

``CallOutput`` applies this to one call of a lane view. Inside one subscription it follows
the decoded ops of each batch (``Mirror.last_ops``) on the call's text path: ``a`` prints, ``t``
drops. The producer's diff picks the *longest* overlap, so when a repetitive window slides the
ops undercount what was written (a window that slid by one identical line shows no op at all);
then the ``totalBytes`` carried with the text decide, and only an exact fit is believed -- never
for a complete window, which cannot slide (its ops are exact; only cleaning makes its bytes
differ from the totals). An op that replaces the text or one of its parents (a base, an ``s``)
falls back to ``resync``. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["Follower", "CallOutput", "overlaps", "text_path"]


def overlaps(prev: str, new: str) -> list[int]:
    """Every ``k`` with ``prev.endswith(new[:k])``, longest first (always ends with 0).

    KMP: the failure function of ``new``, run over the last ``len(new)`` chars of ``prev``,
    then the chain of borders from the final state. O(len(prev) + len(new)).
    """
    m = len(new)
    if m == 0 or not prev:
        return [0]
    fail = [0] * m
    k = 0
    for i in range(1, m):
        while k and new[i] != new[k]:
            k = fail[k - 1]
        if new[i] == new[k]:
            k += 1
        fail[i] = k
    q = 0
    for ch in prev[-m:]:
        if q == m:
            q = fail[q - 1]
        while q and ch != new[q]:
            q = fail[q - 1]
        if ch == new[q]:
            q += 1
    result = []
    while q:
        result.append(q)
        q = fail[q - 1]
    result.append(0)
    return result


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class Follower:
    """The printed-so-far side of one output window. Every method returns the text to print."""

    def __init__(self) -> None:
        #: The text the printed stream ends with (the window as last followed).
        self.window = ""
        #: ``totalBytes`` of the output when ``window`` was current, when known.
        self.total_bytes: int | None = None

    def append(self, text: str) -> str:
        self.window += text
        return text

    def drop(self, n: int) -> str:
        self.window = self.window[n:]
        return ""

    def note_total(self, total_bytes: int | None) -> None:
        if total_bytes is not None:
            self.total_bytes = total_bytes

    def _delta(self, total_bytes: int | None) -> int | None:
        if total_bytes is None or self.total_bytes is None or total_bytes < self.total_bytes:
            return None
        return total_bytes - self.total_bytes

    def match_total(self, text: str, total_bytes: int | None) -> str | None:
        """The new part of ``text`` as the totals say, if one overlap fits them exactly.

        Returns None (and changes nothing) when the totals are unknown or no overlap has a new
        part of exactly the bytes written since -- e.g. when dropped control characters make
        the retained text shorter than what the command wrote.
        """
        delta = self._delta(total_bytes)
        if delta is None or delta > _utf8_len(text):
            return None
        for k in overlaps(self.window, text):
            if _utf8_len(text[k:]) == delta:  # bytes grow with the suffix: at most one fits
                self.window = text
                self.note_total(total_bytes)
                return text[k:]
        return None

    def resync(self, text: str, total_bytes: int | None = None, *,
               complete: bool = False) -> str:
        """``text`` is the window now; return its part that was not printed yet.

        ``complete``: the window was never cut (``truncated`` false), so it is all of the
        output: when the old window is its start, the rest is new (no overlap is guessed).
        """
        if complete and text.startswith(self.window):
            new = text[len(self.window):]
            self.window = text
            self.note_total(total_bytes)
            return new
        matched = self.match_total(text, total_bytes)
        if matched is not None:
            return matched
        k = overlaps(self.window, text)[0]
        self.window = text
        self.note_total(total_bytes)
        return text[k:]


def text_path(call_id: str) -> tuple[Any, ...]:
    """Where a call's retained text lives in the lane view (PROTOCOL.md §3.3)."""
    return ("tools", call_id, "output", "content", 0, "text")


def _get(value: Any, path: Sequence[Any]) -> Any:
    for seg in path:
        if isinstance(seg, str) and isinstance(value, dict):
            value = value.get(seg)
        elif isinstance(seg, int) and isinstance(value, list) and 0 <= seg < len(value):
            value = value[seg]
        else:
            return None
    return value


class CallOutput:
    """Follows one call's output through the batches of a lane mirror.

    ``update(ops, view)`` returns the new text to print after a batch; ``printed_bytes`` sums
    the UTF-8 size of everything returned (``update`` and ``finish``). ``running`` is whether
    the call is in ``view["tools"]``; ``settled`` becomes true once it has left (or shows in
    ``recent``); then ``finish(result content)`` gives the last of it.
    """

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.path = text_path(call_id)
        self.follower = Follower()
        self.seen = False
        self.running = False
        self.settled = False
        self.printed_bytes = 0

    def update(self, ops: Sequence[Sequence[Any]], view: Any) -> str:
        piece = self._update(ops, view)
        self.printed_bytes += _utf8_len(piece)
        return piece

    def _update(self, ops: Sequence[Sequence[Any]], view: Any) -> str:
        follower = self.follower
        saved = (follower.window, follower.total_bytes)
        appended, dirty = self._follow_ops(ops)
        call = _get(view, self.path[:2])
        if not isinstance(call, dict):
            self.running = False
            if self.seen or self._in_recent(view):
                self.settled = True
            return appended
        self.seen = self.running = True
        self.settled = False
        text = _get(view, self.path)
        total = _get(call, ("output", "truncation", "totalBytes"))
        total = total if isinstance(total, int) and not isinstance(total, bool) else None
        complete = _get(call, ("output", "truncation", "truncated")) is False
        if not isinstance(text, str):
            follower.note_total(total)
            return appended
        if dirty or follower.window != text:
            # Replaced (a base, an ``s`` on the text or a parent): what is new, by overlap.
            follower.window, follower.total_bytes = saved
            return follower.resync(text, total, complete=complete)
        if not complete and total is not None and saved[1] is not None \
                and total - saved[1] != _utf8_len(appended):
            # The ops undercount when a repetitive window slid (the producer's diff takes the
            # longest overlap): the totals say how much is really new. A complete window never
            # slid: its ops are exact.
            op_window = follower.window
            follower.window, follower.total_bytes = saved
            matched = follower.match_total(text, total)
            if matched is not None:
                return matched
            follower.window = op_window
        follower.note_total(total)
        return appended

    def _follow_ops(self, ops: Sequence[Sequence[Any]]) -> tuple[str, bool]:
        """Apply the batch's ``a``/``t`` on the text path to the follower.

        Returns the appended text and whether an op replaced the text or one of its parents.
        """
        path, n = self.path, len(self.path)
        out: list[str] = []
        dirty = False
        for op in ops:
            if op[0] == "r":
                dirty = True
                continue
            op_path = tuple(op[1])
            if not dirty and op_path == path:
                if op[0] == "a":
                    out.append(self.follower.append(op[2]))
                    continue
                if op[0] == "t":
                    self.follower.drop(op[2])
                    continue
            if len(op_path) <= n and op_path == path[: len(op_path)]:
                dirty = True
        return "".join(out), dirty

    def _in_recent(self, view: Any) -> bool:
        recent = _get(view, ("recent",))
        return isinstance(recent, list) and any(
            isinstance(item, dict) and item.get("callId") == self.call_id for item in recent
        )

    def finish(self, final_text: str | None, total_bytes: int | None = None,
               truncated: bool | None = None) -> str:
        """The tail to print after the call settled: what of its final result's text (the
        last window) was not printed yet. The lane may never show the last window -- a call
        removed in the same flush takes its last output changes with it. ``truncated``: the
        result's ``truncation.truncated`` (False: the text is all of the output)."""
        if final_text is None:
            return ""
        piece = self.follower.resync(final_text, total_bytes, complete=truncated is False)
        self.printed_bytes += _utf8_len(piece)
        return piece
