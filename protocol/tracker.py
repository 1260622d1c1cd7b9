"""Turn a producer's writes to plain state into minimal op batches (OPS.md §5).

Theory of operation: a producer owns one plain JSON value and changes it *only* through a
``Tracker`` (``set``, ``delete``, ``append``, ``set_text``, ``splice`` and the list
conveniences). The tracker does not log writes; it remembers *where* the state changed and
*what was there at the last flush*, and computes the ops when ``flush()`` is called. So a
thousand appends to one string between two flushes cost one ``a``, a rolling window costs one
``t`` + ``a`` pair, and a list push costs one ``p``.

The dirty set is an antichain of paths kept in a small trie: no dirty path is a prefix of
another. Each dirty path holds a snapshot of its value at the last flush (``MISSING`` for a key
that did not exist). A write:

1. is checked completely first (path syntax, reserved segments, target types, ranges, JSON
   values); a rejected call raises ``OpError`` and changes nothing;
2. marks the path it changes, *before* changing it. A list-length change (push, pop, splice,
   ``set`` one past the end) marks the list itself, so an index path, once dirty, always means
   the same element. If the path or one of its ancestors is already dirty, nothing is recorded.
   Otherwise the current value is snapshotted (containers copied, strings shared) and every
   dirty descendant is absorbed: its snapshot is written back into the new snapshot, so the
   snapshot is the state at the last flush;
3. mutates the live value.

``flush()`` diffs, per dirty path, the snapshot against the live value (``protocol.diff``:
``a``/``t``/``s`` for strings, one ``p`` for lists, ``d``/``s`` per key for objects, with a
bounded rolling-window overlap search). The first flush, and the first after ``rebase()``, is
the base batch ``[["r", copy]]``.

Ops returned by ``flush`` never share a container with the live state (values are copied;
strings are immutable and shared). The tracker does no I/O and has no clock: the caller decides
when to flush (EXEC.md §2 pacing).
"""

from __future__ import annotations

from typing import Any

import msgspec

from .apply import _parent, _resolve, _step
from .diff import MAX_CANDIDATES, MISSING, PROBE, Differ
from .diff import tree_copy as _tree_copy
from .errors import OpError
from .ops import check_path, copy_json_value, json_equal

__all__ = ["MAX_CANDIDATES", "PROBE", "Tracker", "TrackerStatistics"]


class _Node:
    """One trie node per path segment; a dirty node has no children (antichain)."""

    __slots__ = ("children", "dirty", "snap")

    def __init__(self) -> None:
        self.children: dict[Any, _Node] = {}
        self.dirty = False
        self.snap: Any = None


class TrackerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters since the tracker was made (``Tracker.statistics()``).

    ``flushes``: calls to ``flush``; ``base_batches``: flushes that returned ``[["r", …]]``;
    ``ops``: ops returned in total; ``dirty_paths``: paths dirty right now; ``text_diffs``:
    string pairs diffed; ``text_candidates``: overlap candidates verified (≤ ``MAX_CANDIDATES``
    + ``PROBE`` − 1 per diff); ``text_chars_compared``: code points compared by those
    verifications; ``text_fallbacks``: diffs that found no overlap and emitted ``s``.
    """

    flushes: int
    base_batches: int
    ops: int
    dirty_paths: int
    text_diffs: int
    text_candidates: int
    text_chars_compared: int
    text_fallbacks: int


def _index(x: Any, what: str) -> int:
    if type(x) is not int or x < 0:
        raise OpError("type", f"{what} must be an integer >= 0, got {x!r}")
    return x


class Tracker:
    """Records writes to one plain JSON value and turns them into op batches (OPS.md §5).

    ``Tracker(initial)``: ``initial`` is a dict or list (default ``{}``), checked as a JSON
    value (``OpError("value")``) and copied. Paths are lists or tuples of segments (OPS.md §1).
    Every write raises ``OpError`` on a bad call and then leaves the state unchanged: kinds
    ``path``/``reserved`` (path syntax or a segment that does not fit its container),
    ``missing``/``range`` (no such key or index), ``type`` (wrong target type or argument) and
    ``value`` (a non-JSON value). Not thread-safe; one owner.
    """

    def __init__(self, initial: dict | list | None = None) -> None:
        if initial is None:
            initial = {}
        if type(initial) is not dict and type(initial) is not list:
            raise OpError("type", f"the root is a dict or a list, not {type(initial).__name__}")
        self._value: Any = copy_json_value(initial)
        self._trie = _Node()
        self._ndirty = 0
        self._base_pending = True
        self._flushes = 0
        self._base_batches = 0
        self._ops = 0
        self._differ = Differ()

    # --- reading ---------------------------------------------------------------------------

    @property
    def value(self) -> Any:
        """The live state. Read it, never mutate it (writes must go through the tracker)."""
        return self._value

    @property
    def dirty(self) -> bool:
        """True when a write was recorded (or a base is due) since the last flush.

        The next ``flush`` may still return ``[]`` when the writes cancelled out.
        """
        return self._base_pending or self._ndirty > 0

    def statistics(self) -> TrackerStatistics:
        """Counters for tests and metrics (see ``TrackerStatistics``)."""
        return TrackerStatistics(
            flushes=self._flushes,
            base_batches=self._base_batches,
            ops=self._ops,
            dirty_paths=self._ndirty,
            text_diffs=self._differ.text_diffs,
            text_candidates=self._differ.text_candidates,
            text_chars_compared=self._differ.text_chars,
            text_fallbacks=self._differ.text_fallbacks,
        )

    # --- writes ----------------------------------------------------------------------------

    def set(self, path: Any, value: Any) -> None:
        """Set an object key (new or existing) or an array index ``0 <= i <= len`` to ``value``.

        ``i == len`` appends. The empty path replaces the whole value (with a dict or list).
        ``value`` is checked and copied.
        """
        p = self._path(path, allow_empty=True)
        v = copy_json_value(value)
        if not p:
            if type(v) is not dict and type(v) is not list:
                raise OpError("type", "the tracked root is a dict or a list")
            self._mark(p)
            self._value = v
            return
        parent, key = _parent(self._value, p)
        t = type(parent)
        if t is dict:
            if type(key) is not str:
                raise OpError("path", f"index {key!r} used on an object at {list(p)}")
            self._mark(p)
            parent[key] = v
        elif t is list:
            if type(key) is not int:
                raise OpError("path", f"key {key!r} used on an array at {list(p)}")
            n = len(parent)
            if key < n:
                self._mark(p)
                parent[key] = v
            elif key == n:
                self._mark(p[:-1])  # a length change: the list itself is dirty
                parent.append(v)
            else:
                raise OpError("range", f"index {key} > length {n} at {list(p)}")
        else:
            raise OpError("path", f"cannot set {key!r} in a {type(parent).__name__} ({list(p)})")

    def delete(self, path: Any) -> None:
        """Delete an existing object key (arrays shrink through ``pop``/``splice``)."""
        p = self._path(path)
        parent, key = _parent(self._value, p)
        t = type(parent)
        if t is list:
            raise OpError("type", f"delete removes object keys; arrays use pop/splice ({list(p)})")
        if t is not dict:
            raise OpError("path", f"cannot delete {key!r} inside a {type(parent).__name__}")
        if type(key) is not str:
            raise OpError("path", f"index {key!r} used on an object at {list(p)}")
        if key not in parent:
            raise OpError("missing", f"no key {key!r} to delete at {list(p)}")
        self._mark(p)
        del parent[key]

    def append(self, path: Any, text: str) -> None:
        """Append ``text`` to the existing string at ``path`` (an ``a`` at flush)."""
        p = self._path(path)
        if type(text) is not str:
            raise OpError("type", f"append takes a str, got {type(text).__name__}")
        copy_json_value(text)  # no lone surrogates
        parent, key = self._text_target(p)
        if text:
            self._mark(p)
            parent[key] = parent[key] + text

    def set_text(self, path: Any, text: str) -> None:
        """Replace the existing string at ``path`` with ``text``.

        At flush: ``a`` if it only grew, ``t`` (+ ``a``) if a suffix of the old text starts the
        new one (a rolling window), else ``s``.
        """
        p = self._path(path)
        if type(text) is not str:
            raise OpError("type", f"set_text takes a str, got {type(text).__name__}")
        copy_json_value(text)
        parent, key = self._text_target(p)
        if parent[key] is not text:
            self._mark(p)
            parent[key] = text

    def splice(self, path: Any, index: int, remove: int, items: Any = ()) -> list:
        """``target[index:index+remove] = items`` on the array at ``path`` (``[]``: the root).

        ``0 <= index <= len`` and ``0 <= remove <= len - index``; ``items`` is a list or tuple
        of JSON values (checked and copied). Returns the removed items. One ``p`` at flush.
        """
        p = self._path(path, allow_empty=True)
        index = _index(index, "splice index")
        remove = _index(remove, "splice remove count")
        if type(items) is not list and type(items) is not tuple:
            raise OpError("type", f"splice items must be a list, got {type(items).__name__}")
        new = copy_json_value(list(items))
        target = self._list_target(p)
        n = len(target)
        if index > n:
            raise OpError("range", f"splice index {index} > length {n} at {list(p)}")
        if remove > n - index:
            raise OpError("range", f"splice removes {remove} at {index} of length {n} ({list(p)})")
        if remove == 0 and not new:
            return []
        self._mark(p)
        removed = target[index : index + remove]
        target[index : index + remove] = new
        return removed

    def push(self, path: Any, item: Any) -> None:
        """Append ``item`` to the array at ``path``."""
        p = self._path(path, allow_empty=True)
        self.splice(p, len(self._list_target(p)), 0, [item])

    def insert(self, path: Any, index: int, item: Any) -> None:
        """Insert ``item`` before ``index`` (``0 <= index <= len``) in the array at ``path``."""
        self.splice(path, index, 0, [item])

    def pop(self, path: Any, index: int = -1) -> Any:
        """Remove and return the item at ``index`` (negative counts from the end)."""
        p = self._path(path, allow_empty=True)
        target = self._list_target(p)
        if type(index) is not int:
            raise OpError("type", f"pop index must be an integer, got {index!r}")
        n = len(target)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise OpError("range", f"pop index {index} out of range for length {n} at {list(p)}")
        return self.splice(p, i, 1, [])[0]

    def remove(self, path: Any, item: Any) -> None:
        """Remove the first item strictly equal to ``item`` from the array at ``path``."""
        p = self._path(path, allow_empty=True)
        target = self._list_target(p)
        for i, x in enumerate(target):
            if json_equal(x, item):
                self.splice(p, i, 1, [])
                return
        raise OpError("missing", f"item {item!r} not in the array at {list(p)}")

    # --- flushing --------------------------------------------------------------------------

    def rebase(self) -> None:
        """Make the next ``flush`` a base batch (a late joiner, an overflow, a decode error)."""
        self._base_pending = True
        self._clear_dirty()

    def flush(self) -> list:
        """The ops since the last flush, as one Op-form batch (``[]`` when nothing changed).

        The first flush and the first after ``rebase()`` return ``[["r", copy of value]]``.
        Ops hold copies, never the live containers.
        """
        self._flushes += 1
        if self._base_pending:
            self._base_pending = False
            self._clear_dirty()
            self._base_batches += 1
            self._ops += 1
            return [["r", _tree_copy(self._value)]]
        ops: list = []
        if self._ndirty:
            diff = self._differ.diff
            stack: list = [((), self._trie)]
            while stack:
                path, node = stack.pop()
                if node.dirty:
                    diff(path, node.snap, self._lookup(path), ops)
                else:
                    for seg, child in reversed(node.children.items()):
                        stack.append((path + (seg,), child))
            self._clear_dirty()
        self._ops += len(ops)
        return ops

    # --- internals -------------------------------------------------------------------------

    @staticmethod
    def _path(path: Any, *, allow_empty: bool = False) -> tuple:
        check_path(path, allow_empty=allow_empty)
        return tuple(path)

    def _text_target(self, p: tuple) -> tuple[Any, Any]:
        parent, key = _parent(self._value, p)
        cur = _step(parent, key)
        if type(cur) is not str:
            raise OpError("type", f"a string is needed at {list(p)}, found {type(cur).__name__}")
        return parent, key

    def _list_target(self, p: tuple) -> list:
        target = _resolve(self._value, p)
        if type(target) is not list:
            raise OpError("type", f"an array is needed at {list(p)}, found {type(target).__name__}")
        return target

    def _lookup(self, path: tuple) -> Any:
        """Value at ``path`` now, or ``MISSING`` when its last object key is absent."""
        node = self._value
        last = len(path) - 1
        for i, seg in enumerate(path):
            if i == last and type(node) is dict and seg not in node:
                return MISSING
            node = node[seg]
        return node

    def _clear_dirty(self) -> None:
        self._trie = _Node()
        self._ndirty = 0

    def _mark(self, path: tuple) -> None:
        """Record that ``path`` is about to change (call before mutating)."""
        node = self._trie
        if node.dirty:
            return
        for seg in path:
            child = node.children.get(seg)
            if child is None:
                child = node.children[seg] = _Node()
            elif child.dirty:
                return
            node = child
        snap = _tree_copy(self._lookup(path))
        if node.children:
            # Absorb dirty descendants: put their last-flush values back into the snapshot.
            stack: list = [((), node)]
            while stack:
                rel, n = stack.pop()
                if n.dirty:
                    self._ndirty -= 1
                    holder = snap
                    for seg in rel[:-1]:
                        holder = holder[seg]
                    if n.snap is MISSING:
                        holder.pop(rel[-1], None)
                    else:
                        holder[rel[-1]] = n.snap
                else:
                    for seg, c in n.children.items():
                        stack.append((rel + (seg,), c))
            node.children = {}
        node.dirty = True
        node.snap = snap
        self._ndirty += 1
