"""The six verbs, their shape, and what counts as a JSON value and a path (OPS.md §1–§2).

Theory of operation: an op is a short list (or tuple) whose first element is its verb:

    ["r", value]                          replace the root
    ["s", path, value]                    set an object key or an array index 0 <= i <= len
    ["d", path]                           delete an existing object key
    ["a", path, text]                     append to an existing string
    ["t", path, n]                        drop the first n chars (code points) of a string
    ["p", path, index, remove, items]     splice an array (path may be [] for the root)

This module checks *shape* only (``validate_op``: verb, arity, path syntax and reserved
segments) and *values* (``check_json_value`` / ``copy_json_value``: OPS.md §1). Whether an op
fits the document it is applied to is ``apply``'s business (``protocol.apply``). Everything
here is iterative, so a hostile 100,000-deep value is an ordinary error, never a
``RecursionError``. Nothing here does I/O.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import OpError

__all__ = [
    "ARITY",
    "MAX_SAFE_INT",
    "RESERVED",
    "VERBS",
    "check_json_value",
    "check_path",
    "copy_json_value",
    "json_equal",
    "validate_op",
]

#: Path segments rejected in any path, when recorded, decoded and applied (OPS.md §1).
RESERVED = frozenset({"__proto__", "constructor", "prototype"})

#: Largest integer a JSON number can carry exactly (JavaScript's Number.MAX_SAFE_INTEGER).
MAX_SAFE_INT = 2**53 - 1

#: Full length of each Op-form verb, verb included (OPS.md §2).
ARITY: dict[str, int] = {"r": 2, "s": 3, "d": 2, "a": 3, "t": 3, "p": 5}

#: The six Op-form verbs (``"#"`` exists only on the wire, see ``protocol.codec``).
VERBS = frozenset(ARITY)

_SEQ = (list, tuple)


def _show_path(path: Any) -> str:
    try:
        return repr(list(path))
    except TypeError:
        return repr(path)


def check_path(path: Any, *, allow_empty: bool = False) -> None:
    """Check the syntax of one path (OPS.md §1); return None or raise ``OpError``.

    ``path`` is a list or tuple of segments: a ``str`` (object key, not in ``RESERVED``) or an
    ``int`` in ``0..MAX_SAFE_INT`` (array index; a ``bool`` is not an index). The empty path
    (the root) is allowed only with ``allow_empty`` (the ``p`` verb).

    Raises ``OpError`` kind ``path`` (not a list, empty, bad segment) or ``reserved``.
    """
    if type(path) not in _SEQ:
        raise OpError("path", f"a path is an array of segments, got {type(path).__name__}")
    if not path and not allow_empty:
        raise OpError("path", "the empty path (the root) is only valid for 'p'")
    for seg in path:
        t = type(seg)
        if t is str:
            if seg in RESERVED:
                raise OpError("reserved", f"segment {seg!r} is reserved: {_show_path(path)}")
        elif t is int:
            if seg < 0 or seg > MAX_SAFE_INT:
                raise OpError("path", f"index {seg} out of 0..2^53-1 in {_show_path(path)}")
        else:
            raise OpError(
                "path",
                f"segment {seg!r} ({t.__name__}) is neither a key (str) nor an index (int)"
                f" in {_show_path(path)}",
            )


def validate_op(op: Any) -> None:
    """Check the shape of one Op-form op: verb, arity and path (OPS.md §2).

    ``op`` is a list or tuple. Payloads (values, counts, indexes) are checked by ``apply``.
    Raises ``OpError`` kind ``type`` (op is not a list), ``arity`` (empty or wrong length),
    ``verb`` (unknown verb, ``"#"`` included), ``path`` or ``reserved``.
    """
    if type(op) not in _SEQ:
        raise OpError("type", f"an op is an array, got {type(op).__name__}")
    if not op:
        raise OpError("arity", "an empty op has no verb")
    verb = op[0]
    if type(verb) is not str or verb not in ARITY:
        raise OpError("verb", f"unknown verb {verb!r} (expected one of r, s, d, a, t, p)")
    if len(op) != ARITY[verb]:
        raise OpError("arity", f"{verb!r} takes {ARITY[verb]} elements, got {len(op)}")
    if verb != "r":
        check_path(op[1], allow_empty=verb == "p")


# --- values -------------------------------------------------------------------------------------


def _bad(kind: str, where: list, what: str) -> OpError:
    loc = "$" + "".join(f"[{k!r}]" if type(k) is str else f"[{k}]" for k in where)
    return OpError(kind, f"not a JSON value at {loc}: {what}")


_CONTAINER = 1  # _scalar_problem: a list or dict, to be walked


def _scalar_problem(v: Any, t: type) -> Any:
    """None for an accepted scalar, ``_CONTAINER`` for a list or dict, else what is wrong."""
    if t is str:
        if v.isascii():
            return None
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return "string holds a lone surrogate (not encodable as UTF-8)"
        return None
    if v is None or t is bool:
        return None
    if t is int:
        return None if -MAX_SAFE_INT <= v <= MAX_SAFE_INT else f"integer {v} beyond ±(2^53-1)"
    if t is float:
        return None if math.isfinite(v) else f"float {v!r} is not finite"
    if t is list or t is dict:
        return _CONTAINER
    return f"{t.__name__} is not one of null, bool, int, float, str, list, dict"


def _walk(value: Any, kind: str, copy: bool) -> Any:
    """Check ``value`` (and copy it when ``copy``) without recursion.

    Containers are copied, strings and numbers shared (they are immutable). A container that
    holds itself (a cycle) is rejected; a container shared by two parents is copied twice.
    """
    t = type(value)
    problem = _scalar_problem(value, t)
    if problem is None:
        return value
    if problem is not _CONTAINER:
        raise _bad(kind, [], problem)
    root: Any = ([] if t is list else {}) if copy else None
    where: list = []  # keys from the root down to the frame on top of the stack
    active = {id(value)}  # containers on the current descent (cycle detection)
    is_dict = t is dict
    stack = [(value, root, iter(value.items()) if is_dict else enumerate(value), is_dict)]
    while stack:
        src, dst, it, is_dict = stack[-1]
        for key, v in it:
            if is_dict and type(key) is not str:
                raise _bad(kind, where, f"object key {key!r} is not a str")
            if is_dict and not key.isascii():
                problem = _scalar_problem(key, str)
                if problem is not None:
                    raise _bad(kind, where, f"object key: {problem}")
            tv = type(v)
            problem = _scalar_problem(v, tv)
            if problem is None:
                if copy:
                    if is_dict:
                        dst[key] = v
                    else:
                        dst.append(v)
                continue
            if problem is not _CONTAINER:
                raise _bad(kind, where + [key], problem)
            if id(v) in active:
                raise _bad(kind, where + [key], "the value contains itself (a cycle)")
            child: Any = ([] if tv is list else {}) if copy else None
            if copy:
                if is_dict:
                    dst[key] = child
                else:
                    dst.append(child)
            active.add(id(v))
            where.append(key)
            is_obj = tv is dict
            stack.append((v, child, iter(v.items()) if is_obj else enumerate(v), is_obj))
            break
        else:
            stack.pop()
            active.discard(id(src))
            if where:
                where.pop()
    return root


def check_json_value(value: Any, *, kind: str = "value") -> None:
    """Raise ``OpError(kind)`` unless ``value`` is a JSON value (OPS.md §1).

    Accepted: ``None``, ``bool``, ``int`` with ``|n| <= 2^53-1``, finite ``float``, ``str``
    (UTF-8 encodable: no lone surrogates), ``list`` and ``dict`` with ``str`` keys, nested to any
    depth (checked iteratively). Exact types only: tuples, sets, bytes, subclasses (``IntEnum``,
    ``OrderedDict``), datetimes and other objects are rejected, never coerced. Cycles are
    rejected. ``kind`` is ``"value"`` at record time (tracker) and ``"type"`` inside ``apply``.
    """
    _walk(value, kind, False)


def copy_json_value(value: Any, *, kind: str = "value") -> Any:
    """Check ``value`` like ``check_json_value`` and return a deep copy of it.

    Lists and dicts are new objects; strings and numbers are shared (immutable), so copying a
    50 KB string costs nothing. Raises ``OpError(kind)``.
    """
    return _walk(value, kind, True)


def _float_same(a: float, b: float) -> bool:
    return a == b and (a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))


def json_equal(a: Any, b: Any) -> bool:
    """Strict equality of two JSON values: same JSON text up to object key order.

    Unlike ``==``, ``True`` differs from ``1``, ``1`` from ``1.0`` and ``0.0`` from ``-0.0``
    (they encode differently). Iterative; values are assumed acyclic (checked ones are).
    """
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        tx = type(x)
        if tx is not type(y):
            return False
        if tx is float:
            if not _float_same(x, y):
                return False
        elif tx is list:
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif tx is dict:
            if len(x) != len(y):
                return False
            for k, vx in x.items():
                if k not in y:
                    return False
                stack.append((vx, y[k]))
        elif x != y:
            return False
    return True
