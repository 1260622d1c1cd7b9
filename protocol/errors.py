"""The one exception of the ops vocabulary (OPS.md §2).

Theory of operation: every layer that touches ops (validation, ``apply``, the wire codec, the
tracker) reports a violation the same way, with an ``OpError`` whose ``kind`` names the class of
violation. The kinds are the ones the conformance vectors name (``verb``, ``arity``, ``path``,
``reserved``, ``type``, ``range``, ``missing``, ``ref``) plus ``value`` for a non-JSON value
offered to the tracker. ``OpError`` subclasses ``ValueError`` so that callers that only care
about "bad input" can catch that. An ``OpError`` is never a silent no-op: after one, a mirror is
suspect (drop it, wait for a base batch); a tracker or codec is left as it was before the call.
"""

from __future__ import annotations

__all__ = ["OP_ERROR_KINDS", "OpError"]

#: Every kind an ``OpError`` may carry, with what it means.
OP_ERROR_KINDS: dict[str, str] = {
    "verb": "unknown verb (or a wire-only verb where ops are expected)",
    "arity": "wrong number of elements for the verb",
    "path": "malformed path or a segment of the wrong kind for its container",
    "reserved": "a reserved segment (__proto__, constructor, prototype) in a path",
    "type": "wrong type of target or argument (or a non-JSON value in an op)",
    "range": "index, count or table size out of range",
    "missing": "object key not present",
    "ref": "bad path reference on the wire (undefined, skipped id, nothing to shorten from)",
    "value": "a value offered to the tracker is not a JSON value (OPS.md §1)",
}


class OpError(ValueError):
    """A violation of the ops contract.

    ``kind`` is one of ``OP_ERROR_KINDS``; ``str(err)`` is a sentence naming what was wrong and
    where (op index, path), e.g. ``"range: op 2 ('t' at ['out']): count 9 > length 4"``.
    """

    def __init__(self, kind: str, message: str) -> None:
        if kind not in OP_ERROR_KINDS:  # a bug in this package, not bad input
            raise AssertionError(f"unknown OpError kind {kind!r}")
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.detail = message

    def __reduce__(self):  # keep it picklable despite the two-argument constructor
        return (type(self), (self.kind, self.detail))
