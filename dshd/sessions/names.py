"""Session names and references: which session a reference names, and names kept unique.

Theory of operation: a name is a durable ``session/name`` event folded into the session's
settings (``storage.snapshot.fold_settings``), so it lives in the log and its summary like the
approval policy and comes back on every open and list. It is unique per owner among the
sessions that exist: :class:`SessionNames` checks a new name against the registry's list (the
summaries of the closed sessions, cached, and the open ones; no log read) under one lock held
until the name's event is durable, so two requests never take the same name. The list is the
index: a deleted session's directory is gone, so it is not listed and its name is free again
(``SessionRegistry.forget_deleted`` drops what the registry remembered of it).

:func:`find` resolves a reference over the infos a caller may use (PROTOCOL.md §3.1): an exact
id, then an exact name, then a unique prefix of the ids and names; with no reference, the
newest session (``updatedAt``, then id) whose cwd is the given directory (with a ``busy``
predicate -- ``session.find``'s ``running`` -- the newest busy one there first). Nothing found and
more than one found are ``SessionNotFound`` (-32004), the latter with ``AMBIGUOUS`` and at most
``FIND_CANDIDATES_MAX`` candidates. Pure but for the lock.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

import trio

from protocol.names import FIND_CANDIDATES_MAX

from ..errors import InvalidParams, SessionNotFound

__all__ = ["SessionNames", "find"]

#: Candidates an AMBIGUOUS message names in its sentence (all of them are in ``data``).
SAID_CANDIDATES = 5


class SessionNames:
    """Unique names per owner (module doc). ``list_infos``: the registry's ``list``."""

    def __init__(self, list_infos: Callable[[], Awaitable[list[dict]]]) -> None:
        self._list = list_infos
        self._lock = trio.Lock()

    async def holder(self, owner: int | None, name: str, except_id: str | None = None
                     ) -> str | None:
        """The id of the session of ``owner`` named ``name`` (not ``except_id``), or None."""
        for info in await self._list():
            if (info.get("name") == name and info.get("owner") == owner
                    and info["sessionId"] != except_id):
                return info["sessionId"]
        return None

    @asynccontextmanager
    async def claim(self, owner: int | None, name: str | None,
                    except_id: str | None = None) -> AsyncIterator[None]:
        """Hold the naming lock while the block records ``name`` (None: nothing to check);
        ``NAME_TAKEN`` (-32602) when another session of ``owner`` has it."""
        if name is None:
            yield
            return
        async with self._lock:
            taken = await self.holder(owner, name, except_id)
            if taken is not None:
                raise InvalidParams(
                    f"the name {name!r} is taken by session {taken}; pick another, or rename "
                    f"or remove that one (dsh rename {taken} NEW)",
                    field="name", code="NAME_TAKEN", sessionId=taken)
            yield


def find(infos: list[dict], ref: str | None, cwd: str | None,
         busy: Callable[[dict], bool] | None = None) -> tuple[dict, str]:
    """(the info ``ref`` names, how) over ``infos`` (the caller's; module doc); ``busy``:
    with no ``ref``, prefer the newest session of ``cwd`` it holds for."""
    if ref is None:
        newest = _newest_in(infos, cwd)
        running = [i for i in infos if i.get("cwd") == cwd and busy is not None and busy(i)]
        if running:
            best = _newest_in(running, cwd)
            return best, ("newest-in-cwd" if best is newest else "running-in-cwd")
        return newest, "newest-in-cwd"
    for info in infos:
        if info["sessionId"] == ref:
            return info, "id"
    named = [i for i in infos if i.get("name") == ref]
    if len(named) == 1:
        return named[0], "name"
    if named:
        raise _ambiguous(ref, named)
    matched = [i for i in infos
               if i["sessionId"].startswith(ref) or (i.get("name") or "").startswith(ref)]
    if len(matched) == 1:
        return matched[0], "prefix"
    if matched:
        raise _ambiguous(ref, matched)
    raise SessionNotFound(f"session {ref} not found: no session has that id or name, nor one "
                          "starting with it; `dsh sessions` lists them")


def _newest_in(infos: list[dict], cwd: str | None) -> dict:
    if cwd is None:
        raise SessionNotFound("name a session (its id, its name or a unique prefix of either), "
                              "or pass cwd to take the newest session of that directory")
    here = [i for i in infos if i.get("cwd") == cwd]
    if not here:
        raise SessionNotFound(f"no session works in {cwd}; name one (its id, its name or a "
                              "unique prefix; `dsh sessions` lists them) or start one there "
                              "(dsh run)")
    return max(here, key=lambda i: (i.get("updatedAt") or 0, i["sessionId"]))


def _ambiguous(ref: str, matched: list[dict]) -> SessionNotFound:
    matched = sorted(matched, key=lambda i: (i.get("updatedAt") or 0, i["sessionId"]),
                     reverse=True)
    candidates = [{"sessionId": i["sessionId"], "name": i.get("name")}
                  for i in matched[:FIND_CANDIDATES_MAX]]
    said = ", ".join(c["sessionId"] + (f" ({c['name']})" if c["name"] else "")
                     for c in candidates[:SAID_CANDIDATES])
    more = f" and {len(matched) - SAID_CANDIDATES} more" if len(matched) > SAID_CANDIDATES else ""
    return SessionNotFound(f"{ref!r} matches {len(matched)} sessions: {said}{more}; type more "
                           "of the id or the name", {"code": "AMBIGUOUS",
                                                     "candidates": candidates})
