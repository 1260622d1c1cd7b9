"""Reading a protocol struct as the JSON object it encodes to (a mixin).

Theory of operation: a result, lane or event struct is read by attribute, snake_case
(``result.exit_code``). Code written against the plain JSON of PROTOCOL.md -- scripts, tests,
whatever consumed the client's answers before they were typed -- reads it by wire name
instead: ``result["exitCode"]``, ``result.get("errorCode")``, ``"damaged" in info``,
``dict(info)``. :class:`JsonView` answers those from the struct's JSON value, exactly what it
encodes to (``msgspec.to_builtins``: camelCase names, an event's ``"type"`` tag, ``UNSET``
and omitted defaults absent, nested structs as plain dicts). ``==`` against a plain dict
compares that JSON value; against another struct, field by field. Read-only: the JSON value is
a fresh copy, and the wire form stays msgspec's encoding of the struct.

Pure: msgspec only.
"""

from __future__ import annotations

from typing import Any, Iterator

import msgspec

__all__ = ["JsonView"]


class JsonView:
    """Mapping-style reading by wire name for a ``msgspec.Struct`` (module doc)."""

    __slots__ = ()

    def json(self) -> dict[str, Any]:
        """The struct's JSON value (a new dict each time)."""
        return msgspec.to_builtins(self)

    def get(self, key: str, default: Any = None) -> Any:
        return self.json().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.json()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.json()

    def keys(self) -> Any:
        return self.json().keys()

    def items(self) -> Any:
        return self.json().items()

    def __iter__(self) -> Iterator[str]:
        return iter(self.json())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):
            return self.json() == other
        if isinstance(other, msgspec.Struct):
            return type(self) is type(other) and (
                msgspec.structs.astuple(self) == msgspec.structs.astuple(other))  # type: ignore[arg-type]
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  # equal to a dict, so never a set member
