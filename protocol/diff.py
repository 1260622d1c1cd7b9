"""The ops that turn a snapshot of a JSON value into its current value (OPS.md §5).

Theory of operation: the tracker (``protocol.tracker``) keeps, per dirty path, the value it had
at the last flush; at ``flush()`` a :class:`Differ` compares each snapshot with the live value
and appends the ops. Strings give ``a`` (grew), ``t`` + ``a`` (a verified rolling-window
overlap) or ``s``; lists give one ``p`` over
the span between the common prefix and suffix (a single changed element is diffed in place);
objects give ``d`` for removed keys, ``s`` for added ones and recurse into changed ones (an
object holding a reserved key, legal inside values but not in paths, is set whole); any other
change is ``s`` (``r`` at the root). Comparisons are strict (``True`` ≠ ``1`` ≠ ``1.0``).

Rolling-window overlap: find the smallest drop ``k`` such that ``old[k:]`` is a prefix of the
new text. Candidates are offsets where a probe (the new text's first ``PROBE`` chars) occurs in
the old text, found with ``str.find`` in increasing order, and each is verified in full; at most
``MAX_CANDIDATES`` are tried, then overlaps shorter than the probe are checked directly. Past
the bound the diff emits ``s`` (bigger, never wrong). Work per diff is therefore
O(len(old) + len(new)) times a constant, however repetitive the text (``statistics()`` counts
candidates and chars compared).

A :class:`Differ` counts its text work (``Tracker.statistics()`` reports it). Ops never share a
container with the value diffed (``tree_copy``); strings are immutable and shared. Pure.
"""

from __future__ import annotations

from typing import Any

from .ops import RESERVED, json_equal

__all__ = ["MAX_CANDIDATES", "MISSING", "PROBE", "Differ", "tree_copy"]

#: Length (code points) of the probe that finds rolling-window candidates.
PROBE = 32
#: Most probe candidates verified per string diff before giving up on ``t`` + ``a``.
MAX_CANDIDATES = 64


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


#: Snapshot of an object key that did not exist at the last flush.
MISSING: Any = _Missing()


def tree_copy(value: Any) -> Any:
    """Deep copy of an already-checked JSON value, iteratively; strings and numbers shared."""
    t = type(value)
    if t is not list and t is not dict:
        return value
    root: Any = [] if t is list else {}
    stack = [(value, root)]
    while stack:
        src, dst = stack.pop()
        if type(src) is list:
            for x in src:
                tx = type(x)
                if tx is list or tx is dict:
                    child: Any = [] if tx is list else {}
                    stack.append((x, child))
                    x = child
                dst.append(x)
        else:
            for k, x in src.items():
                tx = type(x)
                if tx is list or tx is dict:
                    child = [] if tx is list else {}
                    stack.append((x, child))
                    x = child
                dst[k] = x
    return root


class Differ:
    """Diffs snapshots against live values; ``text_*`` count the work of string diffs."""

    def __init__(self) -> None:
        self.text_diffs = 0
        self.text_candidates = 0
        self.text_chars = 0
        self.text_fallbacks = 0

    def diff(self, path: tuple, old: Any, new: Any, ops: list) -> None:
        """Append to ``ops`` the ops that turn ``old`` (a snapshot, ``MISSING`` for an absent
        key) into ``new`` at ``path`` (module doc)."""
        work = [(path, old, new)]
        while work:
            p, o, n = work.pop()
            if o is n:
                continue
            if o is MISSING:
                ops.append(["s", list(p), tree_copy(n)])
                continue
            if n is MISSING:
                ops.append(["d", list(p)])
                continue
            to, tn = type(o), type(n)
            if to is dict and tn is dict and RESERVED.isdisjoint(o) and RESERVED.isdisjoint(n):
                changed = []
                for k in o:
                    if k not in n:
                        ops.append(["d", [*p, k]])
                for k, nv in n.items():
                    if k in o:
                        if o[k] is not nv:
                            changed.append(((*p, k), o[k], nv))
                    else:
                        ops.append(["s", [*p, k], tree_copy(nv)])
                work.extend(reversed(changed))
            elif to is list and tn is list:
                self._diff_list(p, o, n, ops, work)
            elif to is str and tn is str and p:
                self._diff_text(p, o, n, ops)
            elif not json_equal(o, n):
                if p:
                    ops.append(["s", list(p), tree_copy(n)])
                else:
                    ops.append(["r", tree_copy(n)])

    @staticmethod
    def _diff_list(p: tuple, o: list, n: list, ops: list, work: list) -> None:
        lo, ln = len(o), len(n)
        m = min(lo, ln)
        i = 0
        while i < m and json_equal(o[i], n[i]):
            i += 1
        j = 0
        while j < m - i and json_equal(o[lo - 1 - j], n[ln - 1 - j]):
            j += 1
        remove = lo - i - j
        items = n[i : ln - j]
        if remove == 0 and not items:
            return
        if remove == 1 and len(items) == 1:
            work.append(((*p, i), o[i], n[i]))  # one element changed: diff it in place
            return
        ops.append(["p", list(p), i, remove, [tree_copy(x) for x in items]])

    def _diff_text(self, p: tuple, old: str, new: str, ops: list) -> None:
        if old == new:
            return
        self.text_diffs += 1
        m = len(old)
        if new.startswith(old):
            ops.append(["a", list(p), new[m:]])
            return
        k = self._overlap(old, new)
        if k is None:
            self.text_fallbacks += 1
            ops.append(["s", list(p), new])
            return
        ops.append(["t", list(p), k])
        tail = new[m - k :]
        if tail:
            ops.append(["a", list(p), tail])

    def _overlap(self, old: str, new: str) -> int | None:
        """Smallest ``k >= 1`` with ``new.startswith(old[k:])`` and ``old[k:]`` non-empty, or None.

        Bounded: at most ``MAX_CANDIDATES`` probe hits are verified (overlaps of at least the
        probe length, longest first), then overlaps shorter than the probe are checked.
        """
        m = len(old)
        longest = min(m - 1, len(new))  # the overlap old[k:] is at most this long
        if longest <= 0:
            return None
        probe_len = min(PROBE, longest)
        probe = new[:probe_len]
        k = m - longest
        tried = 0
        while tried < MAX_CANDIDATES:
            k = old.find(probe, k, m)
            if k < 0:
                break
            tried += 1
            self.text_chars += m - k
            if new.startswith(old[k:]):
                self.text_candidates += tried
                return k
            k += 1
        self.text_candidates += tried
        for length in range(probe_len - 1, 0, -1):
            self.text_candidates += 1
            self.text_chars += length
            if old.endswith(new[:length]):
                return m - length
        return None
