"""The two bases of every params and result struct of the client protocol (``protocol.methods``).

Theory of operation: a params struct ignores unknown fields and is camelCase on the wire with
snake_case attributes (``rename="camel"``); a result struct is the same and also reads as its
JSON object (``protocol.jsonview``). Pure: msgspec only.
"""

from __future__ import annotations

import msgspec

from .jsonview import JsonView

__all__ = ["_Params", "_Result"]


class _Params(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Base of params structs: snake_case attributes, camelCase on the wire."""


class _Result(JsonView, msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Base of result structs: snake_case attributes, camelCase on the wire, fields in the
    order the daemon has always sent them; ``UNSET`` fields are left out. A result also reads
    as its JSON object (``protocol.jsonview``: ``info["lastSeq"]``)."""
