"""The wire form of op batches: path interning and shortened ops (OPS.md §3).

Theory of operation: between a producer's ``Encoder`` and a consumer's ``Decoder`` a batch is a
list of ``WireOp``. Two compressions exist only there (``apply`` never sees them):

* **interning**: ``["#", id, path]`` defines id ``id`` (0, 1, 2 … in order). It is emitted just
  before the op that needs it, on a path's *second* use since the last base; the first use is
  inline. An integer in an op's path position refers to a defined id.
* **shortening**: an op that repeats the path of the previous op *in the same batch* leaves the
  path out; arity tells the forms apart (``["s", v]``, ``["d"]``, ``["a", text]``,
  ``["t", n]``, ``["p", index, remove, items]``).

``r`` resets both sides' tables, so a reader can start at any base batch with a fresh decoder.
Both sides are plain state machines with no I/O: ``Encoder.encode(ops) -> wire`` and
``Decoder.decode(wire) -> ops``, one pair per stream and per consumer (never share an encoder
between consumers). Both are atomic per batch: a batch that raises ``OpError`` leaves the
state as it was.

Encoder rule (deterministic, pinned by the vectors), per batch, ``prev = none``::

    r             -> emit r; clear table and seen; prev = none
    path == prev  -> emit shortened
    path in table -> emit with its id
    path in seen  -> id = size(table); table[path] = id; emit ["#", id, path]; emit with id
    otherwise     -> add path to seen; emit inline
    prev = path

Bounds: the decoder's table holds at most ``MAX_TABLE`` (65,536) ids and a definition beyond
that is ``OpError("range")``. An encoder whose table is full sends new paths inline, and its
memory of seen paths stops growing at the same bound. A ``["#", …]`` definition is not an op:
it does not change which path a following shortened op reuses.

Decoder errors (``OpError`` kinds): ``verb`` (unknown verb), ``arity`` (length fits neither
the full nor the shortened form), ``ref`` (undefined or negative ref, an id other than the
next one, a shortened op with no previous op in the batch or right after ``r``), ``path``
(definition path not an array, a bool or other non-int in the path position, bad segment,
empty path for s/d/a/t), ``reserved`` (reserved segment anywhere), ``range`` (table full),
``type`` (a batch or op that is not an array).
"""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import OpError
from .ops import ARITY, check_path, validate_op

__all__ = ["MAX_TABLE", "Decoder", "Encoder", "decode_json", "encode_json"]

#: Bound on path ids per stream (decoder table), and on the encoder's table and seen set.
MAX_TABLE = 65_536

_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


def encode_json(obj: Any) -> bytes:
    """Compact JSON bytes (UTF-8) of ``obj`` via msgspec. Does not validate ops or values."""
    return _json_encoder.encode(obj)


def decode_json(data: bytes | bytearray | memoryview | str) -> Any:
    """Plain Python value of one JSON text. Raises ``msgspec.DecodeError`` on malformed input."""
    return _json_decoder.decode(data)


class Encoder:
    """Op-form batches in, wire batches out, for one stream and one consumer (OPS.md §3).

    ``encode(ops)`` validates the shape of every op (``validate_op``) before touching its state,
    then applies the encoder rule. Wire ops are new lists; values are shared with ``ops`` (not
    copied). ``statistics()`` reports the table and seen sizes.
    """

    def __init__(self) -> None:
        self._table: dict[tuple, int] = {}
        self._seen: set[tuple] = set()

    def encode(self, ops: list) -> list:
        """Wire form of one batch. Raises ``OpError`` (shape of an op); then state is unchanged."""
        if type(ops) is not list and type(ops) is not tuple:
            raise OpError("type", f"a batch is an array of ops, got {type(ops).__name__}")
        for i, op in enumerate(ops):
            try:
                validate_op(op)
            except OpError as e:
                raise OpError(e.kind, f"op {i}: {e.detail}") from None
        table, seen = self._table, self._seen
        out: list = []
        prev: tuple | None = None
        for op in ops:
            verb = op[0]
            if verb == "r":
                out.append(["r", op[1]])
                table.clear()
                seen.clear()
                prev = None
                continue
            path = tuple(op[1])
            rest = op[2:]
            if path == prev:
                out.append([verb, *rest])
            elif path in table:
                out.append([verb, table[path], *rest])
            elif path in seen and len(table) < MAX_TABLE:
                ident = len(table)
                table[path] = ident
                seen.discard(path)
                out.append(["#", ident, list(path)])
                out.append([verb, ident, *rest])
            else:
                if len(seen) < MAX_TABLE:
                    seen.add(path)
                out.append([verb, list(path), *rest])
            prev = path
        return out

    def statistics(self) -> dict:
        """``{"table": ids defined since the last base, "seen": paths used once}``."""
        return {"table": len(self._table), "seen": len(self._seen)}


class Decoder:
    """Wire batches in, Op-form batches out, for one stream (OPS.md §3).

    ``decode(wire)`` resolves refs and shortened ops into plain ``[verb, path, ...]`` lists
    (paths are fresh lists) and checks shapes (``validate_op``); payloads are left to
    ``apply``. Raises ``OpError`` (see the module docstring) naming the failing wire op; the
    table is then as it was before the batch.
    """

    def __init__(self) -> None:
        self._table: list[tuple] = []

    def decode(self, wire: list) -> list:
        """Op form of one wire batch. Raises ``OpError``; then state is unchanged."""
        if type(wire) is not list and type(wire) is not tuple:
            raise OpError("type", f"a batch is an array of wire ops, got {type(wire).__name__}")
        start = len(self._table)
        try:
            table, out = self._decode(wire)
        except OpError:
            del self._table[start:]
            raise
        self._table = table
        return out

    def _decode(self, wire: Any) -> tuple[list, list]:
        table = self._table  # appended in place until an "r" starts a new one
        out: list = []
        prev: tuple | None = None
        for i, w in enumerate(wire):
            try:
                if type(w) is not list and type(w) is not tuple:
                    raise OpError("type", f"a wire op is an array, got {type(w).__name__}")
                if not w:
                    raise OpError("arity", "an empty op has no verb")
                verb = w[0]
                if verb == "#":
                    if len(w) != 3:
                        raise OpError("arity", f"'#' takes 3 elements, got {len(w)}")
                    ident, path = w[1], w[2]
                    if type(ident) is not int:
                        raise OpError("ref", f"definition id {ident!r} is not an integer")
                    if ident != len(table):
                        raise OpError("ref", f"definition id {ident}, expected {len(table)}")
                    if ident >= MAX_TABLE:
                        raise OpError("range", f"path table full ({MAX_TABLE} ids)")
                    check_path(path, allow_empty=True)
                    table.append(tuple(path))
                    continue
                if type(verb) is not str or verb not in ARITY:
                    raise OpError("verb", f"unknown wire verb {verb!r}")
                if verb == "r":
                    if len(w) != 2:
                        raise OpError("arity", f"'r' takes 2 elements, got {len(w)}")
                    table = []
                    prev = None
                    out.append(["r", w[1]])
                    continue
                full = ARITY[verb]
                if len(w) == full:
                    ref = w[1]
                    t = type(ref)
                    if t is int:
                        if not 0 <= ref < len(table):
                            raise OpError("ref", f"path ref {ref} undefined ({len(table)} ids)")
                        path = table[ref]
                    elif t is list or t is tuple:
                        check_path(ref, allow_empty=True)
                        path = tuple(ref)
                    else:
                        raise OpError("path", f"path position holds {ref!r}: not an array or an id")
                    op = [verb, list(path), *w[2:]]
                elif len(w) == full - 1:
                    if prev is None:
                        raise OpError("ref", "shortened op with no previous op in this batch")
                    path = prev
                    op = [verb, list(path), *w[1:]]
                else:
                    raise OpError(
                        "arity",
                        f"{verb!r} takes {full} elements ({full - 1} shortened), got {len(w)}",
                    )
                validate_op(op)  # empty path for s/d/a/t
                out.append(op)
                prev = path
            except OpError as e:
                raise OpError(e.kind, f"wire op {i}: {e.detail}") from None
        return table, out

    def statistics(self) -> dict:
        """``{"table": ids defined since the last base}``."""
        return {"table": len(self._table)}
