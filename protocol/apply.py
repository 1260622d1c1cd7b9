"""Apply a batch of Op-form ops to a plain JSON value (OPS.md §2).

Theory of operation: a client mirrors a view by owning one plain mutable JSON value (dicts,
lists, str, numbers, bool, None) and applying every batch to it in order. ``apply`` walks each
op's path from the root, checks everything (verb, arity, path syntax, reserved segments, target
type, ranges, payload types and values) and mutates the containers in place; only ``r``
replaces the root, which is why ``apply`` returns the (possibly new) root. Values that ops
insert (``s``, ``p`` items, ``r``) are checked and copied, so the mirror never shares a
container with the batch: applying one batch to two mirrors is safe.

Errors: every violation raises ``OpError`` with the kind the conformance vectors name and the
index of the failing op; there is no silent no-op. The ops before the failing one have been
applied, so after an error the mirror is suspect: drop it and wait for a base batch (OPS.md §2).

Chars are code points (Python ``str`` indices), never UTF-16 units or bytes.
"""

from __future__ import annotations

from typing import Any

from .errors import OpError
from .ops import copy_json_value, validate_op

__all__ = ["apply", "is_base"]


def is_base(batch: Any) -> bool:
    """True when ``batch`` is a base batch: exactly ``len(batch) > 0 and batch[0][0] == "r"``."""
    return len(batch) > 0 and batch[0][0] == "r"


def _kind_name(x: Any) -> str:
    t = type(x)
    return {dict: "object", list: "array", str: "string", bool: "bool", type(None): "null"}.get(
        t, t.__name__
    )


def _step(container: Any, seg: Any) -> Any:
    """The child of ``container`` at ``seg``; raise ``path``/``missing``/``range``."""
    t = type(container)
    if t is dict:
        if type(seg) is not str:
            raise OpError("path", f"index {seg!r} used on an object (keys are strings)")
        try:
            return container[seg]
        except KeyError:
            raise OpError("missing", f"no key {seg!r}") from None
    if t is list:
        if type(seg) is not int:
            raise OpError("path", f"key {seg!r} used on an array (indexes are integers)")
        if seg >= len(container):
            raise OpError("range", f"index {seg} out of range for an array of {len(container)}")
        return container[seg]
    raise OpError("path", f"cannot step into a {_kind_name(container)} with {seg!r}")


def _parent(doc: Any, path: Any) -> tuple[Any, Any]:
    """The container holding the last segment of a non-empty ``path``, and that segment."""
    node = doc
    for i in range(len(path) - 1):
        node = _step(node, path[i])
    return node, path[-1]


def _resolve(doc: Any, path: Any) -> Any:
    node = doc
    for seg in path:
        node = _step(node, seg)
    return node


def _count(x: Any, what: str) -> int:
    if type(x) is not int or x < 0:
        raise OpError("type", f"{what} must be an integer >= 0, got {x!r}")
    return x


def _apply_one(doc: Any, op: Any) -> Any:
    validate_op(op)
    verb = op[0]
    if verb == "r":
        return copy_json_value(op[1], kind="type")
    path = op[1]
    if verb == "s":
        value = copy_json_value(op[2], kind="type")
        parent, key = _parent(doc, path)
        t = type(parent)
        if t is dict:
            if type(key) is not str:
                raise OpError("path", f"index {key!r} used on an object (keys are strings)")
            parent[key] = value
        elif t is list:
            if type(key) is not int:
                raise OpError("path", f"key {key!r} used on an array (indexes are integers)")
            n = len(parent)
            if key < n:
                parent[key] = value
            elif key == n:
                parent.append(value)
            else:
                raise OpError("range", f"index {key} > length {n} (set appends at most at len)")
        else:
            raise OpError("path", f"cannot set {key!r} inside a {_kind_name(parent)}")
    elif verb == "d":
        parent, key = _parent(doc, path)
        t = type(parent)
        if t is dict:
            if type(key) is not str:
                raise OpError("path", f"index {key!r} used on an object (keys are strings)")
            if key not in parent:
                raise OpError("missing", f"no key {key!r} to delete")
            del parent[key]
        elif t is list:
            raise OpError("type", "'d' deletes object keys; arrays shrink only through 'p'")
        else:
            raise OpError("path", f"cannot delete {key!r} inside a {_kind_name(parent)}")
    elif verb == "a":
        text = op[2]
        if type(text) is not str:
            raise OpError("type", f"'a' appends a string, got {_kind_name(text)}")
        copy_json_value(text, kind="type")  # no lone surrogates
        parent, key = _parent(doc, path)
        cur = _step(parent, key)
        if type(cur) is not str:
            raise OpError("type", f"'a' needs a string target, found a {_kind_name(cur)}")
        if text:
            parent[key] = cur + text
    elif verb == "t":
        n = _count(op[2], "'t' count")
        parent, key = _parent(doc, path)
        cur = _step(parent, key)
        if type(cur) is not str:
            raise OpError("type", f"'t' needs a string target, found a {_kind_name(cur)}")
        if n > len(cur):
            raise OpError("range", f"'t' count {n} > string length {len(cur)}")
        if n:
            parent[key] = cur[n:]
    else:  # "p"
        index = _count(op[2], "'p' index")
        remove = _count(op[3], "'p' remove count")
        items = op[4]
        if type(items) is not list and type(items) is not tuple:
            raise OpError("type", f"'p' items must be an array, got {_kind_name(items)}")
        items = copy_json_value(list(items), kind="type")
        target = _resolve(doc, path)
        if type(target) is not list:
            raise OpError("type", f"'p' needs an array target, found a {_kind_name(target)}")
        n = len(target)
        if index > n:
            raise OpError("range", f"'p' index {index} > length {n}")
        if remove > n - index:
            raise OpError("range", f"'p' removes {remove} from index {index} of length {n}")
        target[index : index + remove] = items
    return doc


def _describe(op: Any) -> str:
    try:
        verb, path = op[0], op[1] if op[0] != "r" else None
        return f"({verb!r})" if path is None else f"({verb!r} at {path!r})"
    except Exception:
        return ""


def apply(doc: Any, ops: Any) -> Any:
    """Apply ``ops`` (a list of Op-form ops) in order to ``doc``; return the new root.

    ``doc`` is mutated in place (containers); the return value differs from ``doc`` only when
    an ``r`` op replaced the root. Raises ``OpError`` (kind as in OPS.md §2 and the vectors;
    ``type`` for a non-JSON value in an op) naming the failing op's index; ops before it have
    been applied.
    """
    if type(ops) is not list and type(ops) is not tuple:
        raise OpError("type", f"a batch is an array of ops, got {type(ops).__name__}")
    for i, op in enumerate(ops):
        try:
            doc = _apply_one(doc, op)
        except OpError as e:
            raise OpError(e.kind, f"op {i} {_describe(op)}: {e.detail}") from None
    return doc
