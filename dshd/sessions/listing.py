"""``session.list`` of the sessions that are not open: from their summaries, cached, in one hop.

Theory of operation: a closed session is listed from its ``summary.json``
(``dshd.storage.summary.read_summary``: the summary brought up to date by folding only the
frames after it; never a whole log). :meth:`DiskListing.infos` does the work for *every*
closed session of one list in one call, made in one worker thread by the registry (one
``trio.to_thread`` hop per list, not one per session: at 10,000 sessions the hops alone cost
seconds). Each answer is cached by its log's ``(size, mtime_ns, ino)``
(:meth:`DiskListing._key`): a repeat list only stats each log (one ``stat`` a session) and
reads nothing when nothing changed. An info carries the session's name, ``updatedAt`` and
``lastExit`` from the summary (its ``activity``); ``pendingApprovals`` of a closed session is
0 (a session is closed only when none is pending, and one with unsettled calls is opened at
daemon start). The cache holds one small dict per
session directory that exists (entries of directories gone are dropped at each list).

A damaged log is listed as damaged (``damaged``: the storage error) without breaking the
list; a session in which a read found a damaged old frame while it was open is listed with
``damaged`` too (the registry's record, ``damaged_of``), because its summary does not read
those frames. A summary that cannot be read for another reason (an ``OSError``: dshd is out of
file descriptors, say) is answered from the cache when it holds one (it may be stale), else
as ``{"sessionId", "unreadable": reason}``, and the list goes on. Thread safety: the worker thread reads the cache and the damaged record and
returns the new entries; only the trio thread writes the cache (:meth:`store`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..storage.errors import StorageError
from ..storage.format import LOG_NAME_ZSTD
from ..storage.summary import read_summary

__all__ = ["DiskListing", "LogKey"]

LogKey = tuple[int, int, int]


class DiskListing:
    """The closed sessions' SessionInfo (module doc). ``defaults``: the daemon's settings
    (a callable: a reload may change them); ``damaged_of(id)``: the registry's record."""

    def __init__(self, sessions_dir: Path, defaults: Callable[[], dict],
                 damaged_of: Callable[[str], str | None]) -> None:
        self.sessions_dir = sessions_dir
        self._dir = os.fspath(sessions_dir)
        self._defaults = defaults
        self._damaged_of = damaged_of
        #: id -> (the log's (size, mtime_ns, ino), its info or None: no log yet).
        self._cache: dict[str, tuple[LogKey, dict | None]] = {}
        #: summaries read (not answered from the cache) since the daemon started.
        self.reads = 0

    def known(self) -> set[str]:
        """The sessions listed before (when the directory cannot be read: out of fds)."""
        return set(self._cache)

    def forget(self, session_id: str) -> None:
        """The next list reads this session's summary again (its damaged record changed)."""
        self._cache.pop(session_id, None)

    def infos(self, ids: list[str]) -> tuple[list[dict], dict[str, tuple[LogKey, dict | None]]]:
        """(the infos of the sessions ``ids``, the cache entries to store): sync, one worker
        thread for the whole list (module doc)."""
        out: list[dict] = []
        fresh: dict[str, tuple[LogKey, dict | None]] = {}
        cache = self._cache
        for session_id in ids:
            key = self._key(session_id)
            cached = cache.get(session_id)
            if key is not None and cached is not None and cached[0] == key:
                info = cached[1]
            else:
                try:
                    info = self._read_info(session_id)
                except OSError as exc:  # out of fds, say: what is known, else say so
                    info = cached[1] if cached is not None else {
                        "sessionId": session_id, "unreadable": f"{exc.strerror or exc}"}
                    out += [info] if info is not None else []
                    continue
                if key is not None:
                    fresh[session_id] = (key, info)
            if info is not None:
                out.append(info)
        return out, fresh

    def store(self, fresh: dict[str, tuple[LogKey, dict | None]], listed: list[str]) -> None:
        """Keep what :meth:`infos` read (trio thread); drop sessions whose directory is gone."""
        self._cache.update(fresh)
        if len(self._cache) > len(listed):
            keep = set(listed)
            for session_id in [s for s in self._cache if s not in keep]:
                del self._cache[session_id]

    def _key(self, session_id: str) -> LogKey | None:
        """What must stay the same for a cached info to stand: the zstd log's size, mtime
        and inode (the summary is derived from the log). One ``stat`` on a string (no
        ``pathlib``: at 10,000 sessions its objects cost more than the call). None (no
        cache): no zstd log (a plain or newer log, none yet; ``read_summary`` says which).
        A plain log put beside an unchanged zstd one is not seen here (an open refuses it)."""
        try:
            st = os.stat(f"{self._dir}/{session_id}/{LOG_NAME_ZSTD}")
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns, st.st_ino)

    def _read_info(self, session_id: str) -> dict | None:
        """SessionInfo of a closed session from its summary (module doc)."""
        self.reads += 1
        defaults = self._defaults()
        try:
            summary = read_summary(self.sessions_dir / session_id, session_id, defaults)
        except FileNotFoundError:
            return None  # created but never published (a crash before the first write)
        except StorageError as exc:
            return {"sessionId": session_id, "damaged": str(exc)}
        settings = summary.settings
        info = {
            "sessionId": session_id,
            "title": summary.title,
            "cwd": summary.cwd,
            "createdAt": summary.createdAt,
            "approvalPolicy": settings.get("approvalPolicy", defaults["approvalPolicy"]),
            "sandbox": settings.get("sandbox", defaults["sandbox"]),
            "running": 0,
            "lastSeq": summary.lastSeq,
            "owner": settings.get("owner"),
            "name": settings.get("name"),
            "updatedAt": summary.activity.get("updatedAt") or summary.createdAt,
            "pendingApprovals": 0,  # a closed session asks nothing: closing needs none pending
            "lastExit": summary.activity.get("lastExit"),
        }
        damaged = self._damaged_of(session_id)
        if damaged is not None:
            info["damaged"] = damaged
        return info
