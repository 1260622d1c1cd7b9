"""The cleanup methods' params and results (PROTOCOL.md §3.1): ``session.delete`` and
``session.prune``.

Theory of operation: structs only (msgspec, camelCase on the wire); ``protocol.methods``
puts them in the one method table and re-exports them. Pure: msgspec only.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from .structs import _Params, _Result

__all__ = ["PruneSkip", "SessionDeleteParams", "SessionDeleteResult", "SessionPruneParams",
           "SessionPruneResult"]


class SessionDeleteParams(_Params):
    """``session.delete``: ``force`` cancels running calls, approvals and the turn first."""

    session_id: str
    force: bool = False


class SessionDeleteResult(_Result):
    deleted: bool
    cancelled: int = 0


class SessionPruneParams(_Params):
    """``session.prune``: delete idle sessions not updated for ``olderThan`` seconds."""

    older_than: Annotated[float, Meta(ge=0, le=1e10)]
    dry_run: bool = False


class PruneSkip(_Result):
    session_id: str
    reason: str


class SessionPruneResult(_Result):
    """``more``: the request stopped at its bound (``PRUNE_MAX`` deletions); ask again."""

    deleted: list[str]
    skipped: list[PruneSkip]
    freed_bytes: int
    more: bool = False
