"""Session names and references: the name rule and the ``session.find`` / ``session.rename``
structs (PROTOCOL.md §3.1).

Theory of operation: a session may carry a name a person picks (``build``), unique per owner
among the sessions that exist; a *reference* is what a person types for a session: an exact
id, an exact name, or a unique prefix of ids and names, and nothing at all means the newest
session of the working directory. The daemon resolves references (``session.find``) so every
frontend resolves alike; the rule of a name is written once, here (:data:`NAME_PATTERN`).
Pure: msgspec only.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from msgspec import Meta

from .ids import ID_PATTERN
from .structs import _Params, _Result

__all__ = [
    "FIND_CANDIDATES_MAX", "FindHow", "MAX_NAME_CHARS", "MAX_REF_CHARS", "NAME_CHARS",
    "NAME_PATTERN", "NAME_RE", "SessionFindParams", "SessionFindResult",
    "SessionRenameParams", "SessionName", "is_valid_name",
]

MAX_NAME_CHARS = 64
#: The rule of a session name as error messages quote it.
NAME_CHARS = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME_PATTERN = f"^{NAME_CHARS}$"
NAME_RE = re.compile(NAME_CHARS)
#: A reference longer than this cannot name anything (ids and names are <= 64 chars).
MAX_REF_CHARS = 256
#: Candidates an AMBIGUOUS answer lists, at most.
FIND_CANDIDATES_MAX = 20

SessionName = Annotated[str, Meta(pattern=NAME_PATTERN)]
FindHow = Literal["id", "name", "prefix", "newest-in-cwd", "running-in-cwd"]


def is_valid_name(value: object) -> bool:
    """True when ``value`` is a session name (:data:`NAME_PATTERN`)."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


class SessionFindParams(_Params):
    """``session.find``: ``ref`` (an id, a name or a prefix of either), else the newest
    session whose cwd is ``cwd`` -- with ``running``, the newest of those with a running call
    or turn first (``how: running-in-cwd``; none: the newest)."""

    ref: Annotated[str, Meta(min_length=1, max_length=MAX_REF_CHARS)] | None = None
    cwd: Annotated[str, Meta(pattern="^/", max_length=4096)] | None = None
    running: bool | None = None


class SessionFindResult(_Result):
    """``name``: the session's name (null: it has none)."""

    session_id: str
    how: FindHow
    name: str | None = None


class SessionRenameParams(_Params):
    """``session.rename``: ``name`` null clears the name."""

    session_id: Annotated[str, Meta(pattern=ID_PATTERN)]
    name: SessionName | None = None
