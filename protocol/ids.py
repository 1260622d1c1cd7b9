"""Ids a client or the daemon may give a session, a call, an approval or a subscription.

Theory of operation: an id names a file or directory under the state directory (STORAGE.md §1)
and a key of the lane view (OPS.md §1), so the rule is written once, here: 1 to 64 characters
of ``[A-Za-z0-9_-]``, and none of the segments a JavaScript consumer treats specially
(``RESERVED_IDS``). ``ID_PATTERN`` is the same rule as a ``msgspec.Meta`` pattern (anchored),
so params structs refuse a bad id while decoding; :func:`is_valid_id` is the check for values
that do not come through a struct. Pure: ``re`` only.
"""

from __future__ import annotations

import re

__all__ = ["ID_CHARS", "ID_PATTERN", "ID_RE", "MAX_ID_CHARS", "RESERVED_IDS", "is_valid_id"]

MAX_ID_CHARS = 64
#: The characters and length of an id, as the sentence error messages quote.
ID_CHARS = f"[A-Za-z0-9_-]{{1,{MAX_ID_CHARS}}}"
#: Anchored, for ``msgspec.Meta(pattern=...)`` (msgspec searches, it does not match).
ID_PATTERN = f"^{ID_CHARS}$"
ID_RE = re.compile(ID_CHARS)
#: Segments that may not be an id even though they match the pattern (PROTOCOL.md §3.1).
RESERVED_IDS = frozenset({"__proto__", "constructor", "prototype"})


def is_valid_id(value: object) -> bool:
    """True when ``value`` may name a session or a call (and so a file or directory)."""
    return (
        isinstance(value, str)
        and ID_RE.fullmatch(value) is not None
        and value not in RESERVED_IDS
    )
