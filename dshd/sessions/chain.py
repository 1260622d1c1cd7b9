"""The call index of a session being opened: the deltas of its snapshot chain, folded.

Theory of operation: each ``log/snapshot`` of a session carries in its ``session`` dict
(``calls.delta``) only the call index entries added or settled since the snapshot its
``prev`` names (``CallIndex.delta``), so the snapshot bytes over a session's life stay
proportional to its calls (STORAGE.md §7). An open therefore needs every delta of the chain:
:func:`read_index` follows ``prev`` back from the last durable snapshot, reading each frame
whole and verifying it (trailer CRC-32, zstd content checksum, one line that decodes, a
snapshot whose seq is below the one after it), down to ``prev: null`` or to a version-1
snapshot (a whole index: the base of the chain). The entries are folded newest first (the
newest value of an id wins) into one dict and the index is built in one sort
(``CallIndex.from_entries``). Sync (a worker thread); the events after the last snapshot are
the caller's (``logview.absorb`` folds the writer's tail).

Never a wrong index: a snapshot frame on the chain that is damaged loses only its delta,
not the events it covered: those are folded back from the frames before it (walking back
over their trailers, each frame checked whole) down to the previous snapshot, and the chain
goes on from there (``_events_before``). When the chain cannot be followed otherwise (a
frame there does not check either, a delta does not decode, a snapshot written by another
daemon version, a plain log) the index is rebuilt by one verified read of every event
through the last snapshot (``tool/call`` or a model answer's ``toolCalls`` makes
an id known, ``tool/result`` gives its seq). Damage found by that read raises ``LogCorrupt``: the session is
not opened for writing (STORAGE.md §5: listed as damaged, ``dsh fsck`` names the offset),
because an index that misses ids would accept a duplicate call id or answer ``CallNotFound``
for a call that exists.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from ..storage import pages
from ..storage.errors import LogCorrupt, LogTooNew
from ..storage.format import TRAILER_SIZE, decode_event, encode_trailer
from ..storage.snapshot import SNAPSHOT_TYPE
from ..storage.reader import find_log
from .call_index import UNSETTLED, CallIndex, call_digest, parse_digests

log = structlog.get_logger("dshd.session")

__all__ = ["ChainBroken", "INDEX_V1", "INDEX_V2", "parse_delta", "read_index"]

#: ``session["v"]`` of a snapshot dict with the whole index / with a delta.
INDEX_V1, INDEX_V2 = 1, 2


class ChainBroken(ValueError):
    """The chain cannot give the index (module doc): the full read decides."""


def parse_delta(calls: object) -> dict[str, int]:
    """The entries of a version-2 snapshot's ``calls``; ValueError when it is not one."""
    delta = calls.get("delta") if isinstance(calls, dict) else None
    if not isinstance(delta, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= UNSETTLED for k, v in delta.items()):
        raise ValueError("the snapshot's call index delta is not {callId: seq}")
    return delta


def _chain_entries(view: pages.LogView, offset: int | None,
                   digests: dict[str, int]) -> dict[str, int]:
    """Every entry of the chain ending at ``offset`` (module doc), its calls' digests into
    ``digests``; ChainBroken otherwise."""
    merged: dict[str, int] = {}
    seq_after: int | None = None
    while offset is not None:
        try:
            ev = pages.snapshot_at(view, offset)
        except (LogCorrupt, LogTooNew) as exc:
            # its delta is lost; the events it covers are not: fold them back to the
            # snapshot before it, and go on from there
            offset, seq_after = _events_before(view, offset, merged, digests, str(exc))
            continue
        state, prev = ev.data.get("session"), ev.data.get("prev")
        if seq_after is not None and ev.seq >= seq_after:
            raise ChainBroken(f"the snapshot at byte {offset} is not older than the next one")
        seq_after = ev.seq
        version = state.get("v") if isinstance(state, dict) else None
        if version == INDEX_V1:
            index = CallIndex.from_json(state.get("calls"))
            for cid, seq in index.entries().items():
                merged.setdefault(cid, seq)
                if (d := index.digest(cid)) and cid not in digests:
                    digests[cid] = d
            return merged
        if version != INDEX_V2:
            raise ChainBroken(f"the snapshot at byte {offset} holds no call index this daemon "
                              f"reads (session state version {version!r})")
        for cid, seq in parse_delta(state.get("calls")).items():
            merged.setdefault(cid, seq)  # newest first: the newest value wins
        for cid, d in parse_digests(state["calls"].get("digests")).items():
            digests.setdefault(cid, d)
        if prev is not None and (type(prev) is not int or prev >= offset):
            raise ChainBroken(f"the snapshot at byte {offset} names a bad previous {prev!r}")
        offset = prev
    return merged


def _events_before(view: pages.LogView, offset: int, merged: dict[str, int],
                   digests: dict[str, int], why: str) -> tuple[int | None, int | None]:
    """The delta of the damaged snapshot at ``offset``, rebuilt from the events it covered:
    walk back over the trailers from ``offset`` (each frame's length and CRC-32 checked, its
    content decoded and checked whole) folding every event into ``merged`` (newest first),
    down to the previous snapshot; (its offset, or None at the header; the seq after it).
    ChainBroken when a frame there does not check (the full read decides)."""
    log.warning("session.snapshot_delta_rebuilt", session=view.session_id, offset=offset,
                reason=why)
    header_end = pages.read_header(view)[1]
    pos, first_seq = offset, None
    while pos > header_end:
        trailer = view.read(pos - TRAILER_SIZE, TRAILER_SIZE)
        start = pos - TRAILER_SIZE - int.from_bytes(trailer[8:12], "little")
        frame = view.read(start, pos - TRAILER_SIZE - start) if start >= header_end else b""
        if not frame or encode_trailer(frame) != trailer:
            raise ChainBroken(f"{why}; the frame before byte {pos} does not check either")
        try:
            lines = view.decompress(frame, start).split(b"\n")[:-1]
            events = [decode_event(line) for line in lines]
        except (LogCorrupt, ValueError) as exc:
            raise ChainBroken(f"{why}; and {exc}") from None
        if len(events) == 1 and events[0].type == SNAPSHOT_TYPE:
            return start, events[0].seq + 1 if first_seq is None else first_seq
        for ev in reversed(events):
            _fold(merged, digests, ev)
            first_seq = ev.seq
        pos = start
    return None, first_seq


def _fold(entries: dict[str, int], digests: dict[str, int], ev) -> None:
    """One event into ``entries`` read newest first (a later value is already there)."""
    if ev.type == "tool/result":
        entries.setdefault(str(ev.data.get("callId")), ev.seq)
    elif ev.type == "tool/call":
        cid = str(ev.data.get("callId"))
        entries.setdefault(cid, UNSETTLED)
        if d := call_digest(str(ev.data.get("name", "")), ev.data.get("arguments")):
            digests.setdefault(cid, d)
    elif ev.type == "message/assistant":  # a model's calls are known once proposed
        for call in ev.data.get("toolCalls") or ():
            if isinstance(call, dict) and call.get("callId"):
                entries.setdefault(str(call["callId"]), UNSETTLED)


def _full_entries(session_dir: Path, session_id: str, through: int,
                  digests: dict[str, int]) -> dict[str, int]:
    """The index entries of every event through seq ``through``, read and verified."""
    events = []
    for ev in pages.iter_all(session_dir, session_id):
        if ev.seq > through:
            break
        if ev.type in ("tool/call", "tool/result", "message/assistant"):
            events.append(ev)
    entries: dict[str, int] = {}
    for ev in reversed(events):
        _fold(entries, digests, ev)
    return entries


def read_index(session_dir: Path, session_id: str, snapshot_offset: int | None,
               snapshot_seq: int, end: int) -> CallIndex:
    """The call index folded through the last durable snapshot (``snapshot_seq`` at byte
    ``snapshot_offset``; None/-1: no snapshot, an empty index) reading no further than byte
    ``end`` (module doc). LogCorrupt/LogTooNew when the fallback read finds damage."""
    if snapshot_offset is None or snapshot_seq < 0:
        return CallIndex()
    digests: dict[str, int] = {}
    path, compression = find_log(Path(session_dir), session_id)
    try:
        if compression != "zstd":
            raise ChainBroken("a plain log has no frames to follow")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            view = pages.LogView(fd, min(end, os.fstat(fd).st_size), session_id, path)
            entries = _chain_entries(view, snapshot_offset, digests)
        finally:
            os.close(fd)
    except ValueError as exc:  # ChainBroken, or a delta / v1 index that does not decode
        log.warning("session.index_full_read", session=session_id, reason=str(exc))
        digests.clear()
        entries = _full_entries(Path(session_dir), session_id, snapshot_seq, digests)
    return CallIndex.from_entries(entries, digests)
