"""What an open session reads back from its own log, and what it hands the next snapshot.

Theory of operation: an open session keeps only bounded memory (``dshd.sessions.session``):
the writer's ``tail`` (the events since the last ``log/snapshot``, bounded by
``snapshot_every_events`` plus what was appended since, STORAGE.md) and the folded state.
Everything older is on disk and is read back when asked, in a worker thread, through
``SessionLog.read_events`` (``dshd.storage.reader.read_events`` up to the durable end) --
which reads only the frames it needs and verifies each one (the frames before the snapshot
were not verified on open):

* :meth:`LogView.events` -- a ``session.events`` page: from memory when it starts in the tail,
  else from disk up to the tail, then from the tail (the unflushed events are only there);
* :meth:`LogView.history` -- every event, oldest first (the agent's messages): disk up to the
  tail, then the tail; paged, so no page holds more than :data:`PAGE_EVENTS` at once;
* :meth:`LogView.result` -- one ``tool/result`` by seq (``tool.wait`` on a call that fell out
  of the results cache, ``dshd.sessions.call_index``).

Damage found there (``LogCorrupt``) marks the session damaged (``LogView.damaged``, its
``session.list``/``session.get`` info says so) and reaches the caller as ``-32014 LOG_DAMAGED``;
the session keeps working: old frames never decide whether new writes are safe (the tail was
verified on open), and the other sessions are not touched.

:func:`snapshot_state` / :func:`restore` are the session's side of the snapshot frame: an
opaque dict storage writes into ``log/snapshot.data.session`` (``snapshot_state=`` of
``SessionLog``) and hands back on open (``SessionLog.snapshot``). :data:`SNAPSHOT_VERSION`
tells a newer daemon's dict from ours: a dict we cannot read is not used (the session then
folds what it has: the tail; the log itself is still the truth). Since version 2 the dict
holds only the call index entries changed since the previous snapshot (``calls.delta``):
the index of an open is read from the whole snapshot chain first (``dshd.sessions.chain``,
by the registry in a worker thread) and given to :func:`absorb`; a version-1 dict holds the
whole index.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import islice
from typing import Any

import msgspec
import structlog

from protocol.lane import RecentEntry

from ..storage import threads
from ..storage.errors import LogCorrupt, StorageError
from .call_index import CallIndex
from .chain import INDEX_V1, INDEX_V2, parse_delta

log = structlog.get_logger("dshd.session")

__all__ = ["HISTORY_TYPES", "LogView", "PAGE_EVENTS", "SNAPSHOT_VERSION", "absorb", "restore",
           "snapshot_state"]

#: The writer's snapshot events: the daemon's own, never shown to a client (a seq hole).
SNAPSHOT = "log/snapshot"
#: Events read from disk per page (history, and the largest ``session.events`` page).
PAGE_EVENTS = 10_000
SNAPSHOT_VERSION = INDEX_V2
#: The events the agent's history reads (``dshd.agent.history.build_messages``).
HISTORY_TYPES = frozenset({"message/user", "message/assistant", "tool/call", "tool/result"})


def _seq(ev: Any) -> int:
    return ev.seq


class LogView:
    """One open session's reads of its log (module doc). ``log_`` is its ``SessionLog``."""

    def __init__(self, log_: Any, session_id: str) -> None:
        self._log = log_
        self.session_id = session_id
        #: Why the session is damaged (the first ``LogCorrupt`` found in an old frame), or None.
        self.damaged: str | None = None

    def _tail_start(self) -> int:
        """Seq of the first event held in memory (``last_seq + 1`` when none is)."""
        tail = self._log.tail
        return tail[0].seq if tail else self._log.last_seq + 1

    async def _disk(self, after_seq: int, limit: int) -> list:
        try:
            return await threads.run_sync(self._log.read_events, after_seq, limit)
        except LogCorrupt as exc:
            if self.damaged is None:
                self.damaged = str(exc)
                log.error("session.damaged", session=self.session_id, error=str(exc),
                          offset=exc.offset)
            raise

    async def events(self, after_seq: int, limit: int) -> list:
        """Events with seq > ``after_seq``, oldest first, at most ``limit`` (module doc). The
        tail may move on while a disk page is read (a snapshot lets the writer drop what it
        covers): the start of memory is looked at again after each page."""
        out: list = []
        nxt = max(after_seq, -1) + 1
        while len(out) < limit:
            start = self._tail_start()
            if nxt >= start:
                tail = self._log.tail
                first = bisect_left(tail, nxt, key=_seq)
                out += islice((ev for ev in islice(tail, first, None) if ev.type != SNAPSHOT),
                              limit - len(out))
                break
            want = min(limit - len(out), start - nxt)
            page = [ev for ev in await self._disk(nxt - 1, want) if ev.seq < start]
            if len(page) < want or (page and page[0].seq != nxt):
                raise StorageError(
                    f"session {self.session_id}: the log on disk has {len(page)} events after "
                    f"seq {nxt - 1} where {want} were expected (memory starts at seq {start}); "
                    "run `dsh fsck`")
            nxt = page[-1].seq + 1
            out += [ev for ev in page if ev.type != SNAPSHOT]
        return out

    async def history(self, types: frozenset[str] | None = None) -> list:
        """Every event of the session, oldest first (the agent builds its messages from it),
        read in pages of :data:`PAGE_EVENTS`; ``types``: keep only events of these types."""
        out: list = []
        after = -1
        while after < self._log.last_seq:
            page = await self.events(after, PAGE_EVENTS)
            if not page:
                return out
            after = page[-1].seq
            out += page if types is None else [ev for ev in page if ev.type in types]
        return out

    async def result(self, call_id: str, seq: int) -> dict:
        """The ``tool/result`` of ``call_id`` at ``seq``, from the tail or the disk."""
        evs = await self.events(seq - 1, 1)
        if not evs or evs[0].seq != seq or evs[0].type != "tool/result" or (
                evs[0].data.get("callId") != call_id):
            raise StorageError(
                f"session {self.session_id}: the result of call {call_id} should be event "
                f"{seq} of the log, which holds something else; run `dsh fsck`")
        return evs[0].data



def snapshot_state(settings: dict, delta: dict[str, int], recent: list, decided: dict,
                   rules: list | None = None, digests: dict[str, str] | None = None) -> dict:
    """The session's part of a snapshot (module doc): the settings as logged that storage does
    not fold itself (the env), the call index entries changed since the last durable
    snapshot (``CallIndex.delta``) with their calls' digests, the lane's ``recent`` (newest
    first, plain), the decided approvals kept in memory (at most ``DECIDED_MAX``) and the
    approval rules as logged (``RuleBook.snapshot``; a dict without ``rules`` -- an older
    daemon's -- has none: no rule was logged before this daemon knew them)."""
    return {"v": SNAPSHOT_VERSION, "settings": dict(settings),
            "calls": {"delta": delta, "digests": dict(digests or {})}, "recent": list(recent),
            "decided": dict(decided), "rules": list(rules or [])}


def absorb(log_: Any, calls: Any, approvals: Any,
           index: CallIndex | None = None) -> tuple[dict, list[RecentEntry]]:
    """Fold the last snapshot's ``session`` dict and the log's tail into the call table
    (``calls``: ``CallTable``) and the approval desk; ``(env, recent)`` (newest first).
    ``index``: the call index through the last snapshot (``chain.read_index``; required when
    that snapshot holds a delta). The calls still open before the tail come from the writer's
    ``repair_state``. LogCorrupt when the snapshot's dict is ours but does not decode (its
    frame's checksum passed it)."""
    env: dict = {}
    recent: list = []
    try:
        restored = restore(log_.snapshot, index)
    except ValueError as exc:
        raise LogCorrupt(log_.session_id, log_.path, log_.snapshot_offset or 0,
                         f"its last snapshot's session state: {exc}") from None
    if restored is None and index is not None:
        calls.known.index = index  # the full read's (a snapshot this daemon does not read)
    if restored is not None:
        settings, calls.known.index, recent, decided = restored
        env = dict(settings.get("env") or {})
        for approval_id, outcome in decided.items():
            approvals.remember(approval_id, str(outcome))
        approvals.rules.restore(log_.snapshot.get("rules"))
    for ev in log_.tail:
        type_, data = ev.type, ev.data
        if type_ in ("approval/decided", "approval/rule", "approval/rule-revoked"):
            approvals.absorb(type_, data)
        elif type_ == "session/env":
            env = dict(data.get("env") or {})
        elif type_ in ("tool/call", "tool/result"):
            entry = calls.absorb(ev)
            if entry is not None:
                recent.insert(0, entry)
    for cid, call in log_.repair_state.open_calls.items():
        calls.known.called(cid, str(call["data"].get("name", "")), call)
    approvals.rules.opened()
    return env, recent


def restore(state: dict | None, index: CallIndex | None = None
            ) -> tuple[dict, CallIndex, list[RecentEntry], dict] | None:
    """``(settings, index, recent, decided)`` of a snapshot's dict; None when there is none
    or it is not one this daemon reads (module doc). ValueError when it is ours but damaged.
    ``index``: the chain's (required for a version-2 dict, whose own part is a delta)."""
    if not isinstance(state, dict) or state.get("v") not in (INDEX_V1, INDEX_V2):
        return None
    settings = state.get("settings")
    decided = state.get("decided")
    if not isinstance(settings, dict) or not isinstance(decided, dict):
        raise ValueError("the snapshot's session state has no settings or decided approvals")
    try:
        recent = msgspec.convert(state.get("recent") or [], list[RecentEntry])
    except msgspec.ValidationError as exc:
        raise ValueError(f"the snapshot's recent calls do not decode: {exc}") from None
    if state["v"] == INDEX_V2:
        parse_delta(state.get("calls"))  # ours: it must decode (the chain has read it)
        if index is None:
            raise ValueError("a version-2 snapshot's call index is the whole chain's: read it "
                             "with dshd.sessions.chain.read_index first")
    elif index is None:
        index = CallIndex.from_json(state.get("calls"))
    return settings, index, recent, decided
