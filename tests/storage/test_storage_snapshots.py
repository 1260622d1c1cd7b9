"""Snapshot frames, opening from the last one, paged reads and the summary (STORAGE.md §7).

Real files with real fsync; damage is injected by flipping bytes on disk."""

from __future__ import annotations

import json
import os
import shutil
import zlib

import pytest
import zstandard
from storage_helpers import make_header

from dshd.storage import LogCorrupt, SessionLog
from dshd.storage.format import TRAILER_HEAD, TRAILER_SIZE, encode_line, encode_trailer, new_event
from dshd.storage.fsck import check_offline
from dshd.storage.pages import iter_all, read_events
from dshd.storage.reader import read_log
from dshd.storage.repair import RepairState
from dshd.storage.summary import SUMMARY_NAME, read_summary

DEFAULTS = {"approvalPolicy": "ask", "sandbox": "workspace-write", "owner": None}


class Owner:
    """A stand-in owner whose folded state is the count of tool calls it saw."""

    def __init__(self) -> None:
        self.calls = 0

    def state(self) -> dict:
        return {"calls": self.calls}


async def _write(state_dir, n_calls, *, every=5, owner=None, close=True, per_flush=1):
    owner = owner or Owner()
    log = SessionLog.create(state_dir, "s1", make_header(), snapshot_every=every,
                            snapshot_state=owner.state)
    log.append("session/owner", {"uid": 1000}, ignorable=True)
    log.append("approval/policy", {"policy": "never", "source": "config"})
    for i in range(n_calls):
        log.append("tool/call", {"callId": f"c{i}", "name": "bash", "arguments": "{}"})
        owner.calls += 1
        if i % 4 != 3:  # every fourth call stays open
            log.append("tool/result", {"callId": f"c{i}", "isError": False,
                                       "content": f"out {i}", "details": {}})
        if i % per_flush == 0:
            await log.flush()
    if close:
        await log.aclose()
    else:  # a tail after the last snapshot: a frame written while none is due
        log.set_snapshot_state(None)
        log.append("turn/start", {"turnId": "tail"})
        await log.flush()
        log.set_snapshot_state(owner.state)
    return log


def _frames(path):
    """(offset, length) of each data frame of a log with trailers, from its trailers."""
    data = path.read_bytes()
    out, pos = [], len(data)
    while pos > 0:
        assert data[pos - TRAILER_SIZE: pos - 8] == TRAILER_HEAD
        length = int.from_bytes(data[pos - 8: pos - 4], "little")
        start = pos - TRAILER_SIZE - length
        out.append((start, length))
        pos = start
    return out[::-1]


def _snapshot_offsets(path):
    dctx = zstandard.ZstdDecompressor()
    data = path.read_bytes()
    return [s for s, n in _frames(path)
            if b'"type":"log/snapshot"' in dctx.decompressobj().decompress(data[s:s + n])]


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


async def test_snapshots_are_written_every_n_events_and_at_close_each_in_its_own_frame(state_dir):
    log = await _write(state_dir, 23)
    events = read_log(log.session_dir, "s1").events
    assert [e.seq for e in events] == list(range(len(events)))  # seq stays dense
    snaps = [e for e in events if e.type == "log/snapshot"]
    assert len(snaps) >= 5 and all(s.ignorable for s in snaps)
    assert snaps[-1].seq == events[-1].seq  # the clean close ended with one
    offsets = _snapshot_offsets(log.path)
    assert [s.data["verifiedThrough"] for s in snaps] == offsets
    assert [s.data["prev"] for s in snaps] == [None, *offsets[:-1]]
    for snap in snaps:
        before = [e for e in events if e.seq < snap.seq]
        assert snap.data["through"] == snap.seq - 1
        assert snap.data["repair"] == RepairState().see_all(before).to_json()
        assert snap.data["session"] == {
            "calls": sum(1 for e in before if e.type == "tool/call")}
        assert snap.data["settings"] == {"approvalPolicy": "never", "sandbox": None,
                                         "owner": 1000, "name": None}
    assert check_offline(state_dir, "s1").state == "needs-repair"  # open calls, no damage


async def test_open_starts_at_the_last_snapshot_and_keeps_only_the_tail(state_dir):
    first = await _write(state_dir, 23, close=False)  # a tail after the last snapshot
    first.set_snapshot_state(None)
    await first.aclose()
    events = read_log(state_dir / "sessions" / "s1", "s1").events
    last_snap = max(e.seq for e in events if e.type == "log/snapshot")
    log = await SessionLog.open_for_write(state_dir, "s1", snapshot_every=5)
    try:
        assert log.snapshot_seq == last_snap and log.snapshot == events[last_snap].data["session"]
        assert [e.seq for e in log.tail] == [e.seq for e in events if e.seq > last_snap]
        assert log.last_seq == events[-1].seq
        whole = RepairState().see_all(e for e in events if e.type != "log/snapshot")
        assert log.repair_state == whole
        assert log.settings == {"approvalPolicy": "never", "sandbox": None, "owner": 1000, "name": None}
    finally:
        await log.aclose()


async def test_the_tail_in_memory_stays_bounded_while_writing(state_dir):
    owner = Owner()
    log = await _write(state_dir, 60, every=10, owner=owner, close=False)
    try:
        assert len(log.tail) <= 10 + 2  # one batch may land after the snapshot
        assert log.snapshot == {"calls": log.snapshot["calls"]} and log.snapshot_seq > 100
    finally:
        await log.aclose()


async def test_damage_before_the_snapshot_does_not_block_writes_but_reads_and_fsck_find_it(
        state_dir):
    log = await _write(state_dir, 23)
    first_snap = _snapshot_offsets(log.path)[0]
    early = [(s, n) for s, n in _frames(log.path) if 0 < s < first_snap][1]
    _flip(log.path, early[0] + early[1] // 2)
    # Old frames never decide whether new writes are safe: the open reads from the last one.
    reopened = await SessionLog.open_for_write(state_dir, "s1")
    await reopened.aclose()
    with pytest.raises(LogCorrupt) as exc:
        read_events(log.session_dir, "s1", -1, 1000)
    assert exc.value.offset == early[0]
    verdict = check_offline(state_dir, "s1")
    assert verdict.state == "damaged" and verdict.offset == early[0]
    # A page after the last snapshot does not read the damaged frame.
    assert read_events(log.session_dir, "s1", reopened.snapshot_seq, 5) == []


async def test_damage_in_the_tail_after_the_snapshot_is_refused_on_open(state_dir):
    log = await _write(state_dir, 23, close=False)
    log.set_snapshot_state(None)
    await log.aclose()
    last = _snapshot_offsets(log.path)[-1]
    after = [(s, n) for s, n in _frames(log.path) if s > last][0]
    _flip(log.path, after[0] + after[1] // 2)
    with pytest.raises(LogCorrupt) as exc:
        await SessionLog.open_for_write(state_dir, "s1")
    assert exc.value.offset == after[0]


async def test_a_torn_snapshot_frame_is_a_torn_tail_and_the_previous_snapshot_serves(state_dir):
    log = await _write(state_dir, 23)
    last = _snapshot_offsets(log.path)[-1]
    with open(log.path, "r+b") as f:
        f.truncate(last + 20)  # the crash cut the closing snapshot's append
    before = read_log(log.session_dir, "s1")
    assert before.torn and before.events[-1].type != "log/snapshot"
    reopened = await SessionLog.open_for_write(state_dir, "s1", snapshot_every=5,
                                               snapshot_state=lambda: {"calls": -1})
    assert reopened.last_seq == before.events[-1].seq
    assert reopened.repair_state == RepairState().see_all(before.events)
    reopened.append("turn/start", {"turnId": "t"})
    await reopened.aclose()  # truncates the torn bytes, writes a snapshot at close
    after = read_log(log.session_dir, "s1", fold=True, check=True)
    assert not after.torn and after.snapshot.data["session"] == {"calls": -1}


def _crafted_log(path, lines_per_frame):
    """A log written frame by frame with the format encoder (to plant bad snapshots)."""
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    blob = b""
    for lines in lines_per_frame:
        frame = cctx.compress(b"".join(lines))
        blob += frame + encode_trailer(frame)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blob)
    return blob


def test_fsck_calls_a_snapshot_that_disagrees_with_the_fold_before_it_damage(state_dir):
    path = state_dir / "sessions" / "s1" / "session.v1.jsonl.zst"
    call = new_event(0, "tool/call", {"callId": "c", "name": "bash", "arguments": "{}"},
                     time_ms=1)[1]
    header = encode_line(make_header())
    header_len = len(zstandard.ZstdCompressor(write_checksum=True).compress(header)) + 16
    call_len = len(zstandard.ZstdCompressor(write_checksum=True).compress(call)) + 16
    lying = {"through": 0, "verifiedThrough": header_len + call_len, "prev": None,
             "repair": RepairState().to_json(),  # forgets the open call
             "settings": {"approvalPolicy": None, "sandbox": None, "owner": None},
             "session": {}}
    snap = new_event(1, "log/snapshot", lying, time_ms=2, ignorable=True)[1]
    _crafted_log(path, [[header], [call], [snap]])
    verdict = check_offline(state_dir, "s1")
    assert verdict.state == "damaged" and "disagrees" in verdict.reason
    assert verdict.offset == header_len + call_len


async def test_an_old_log_without_snapshots_opens_whole_once_then_gets_one_at_close(state_dir):
    log = SessionLog.create(state_dir, "s1", make_header(), snapshot_every=0)
    for i in range(30):
        log.append("turn/start", {"turnId": f"t{i}"})
    await log.aclose()
    assert not any(e.type == "log/snapshot" for e in read_log(log.session_dir, "s1").events)
    old = await SessionLog.open_for_write(state_dir, "s1", snapshot_state=lambda: {"k": 1})
    assert old.snapshot is None and len(old.tail) == 30
    await old.aclose()
    again = await SessionLog.open_for_write(state_dir, "s1")
    assert again.snapshot == {"k": 1} and again.tail == [] and again.last_seq == 30
    assert list(again.repair_state.open_turns) == [f"t{i}" for i in range(30)]
    await again.aclose()


async def test_read_events_pages_match_the_whole_read(state_dir):
    log = await _write(state_dir, 40, every=7, per_flush=3)
    whole = read_log(log.session_dir, "s1").events
    assert list(iter_all(log.session_dir, "s1")) == whole
    for after in (-5, -1, 0, 6, 7, 8, 30, len(whole) - 2, len(whole) + 3):
        for limit in (0, 1, 5, 1000):
            start = max(after + 1, 0)
            assert read_events(log.session_dir, "s1", after, limit) == whole[start:start + limit]


async def test_read_events_of_an_open_log_stop_at_its_durable_end(state_dir):
    log = await _write(state_dir, 12, close=False)
    log.append("turn/start", {"turnId": "not-yet"})
    page = log.read_events(-1, 10_000)
    assert page[-1].seq == log.durable_seq < log.last_seq
    await log.aclose()


async def test_retract_refolds_the_repair_state(state_dir):
    log = await _write(state_dir, 3, close=False)
    before = log.repair_state.copy()
    ev = log.append("tool/call", {"callId": "x", "name": "bash", "arguments": "{}"})
    assert "x" in log.repair_state.open_calls
    assert log.retract(ev.seq, ev.seq)
    assert log.repair_state == before
    await log.aclose()


async def test_summary_is_written_and_brought_up_to_date_from_the_log(state_dir):
    log = await _write(state_dir, 10)
    session_dir = log.session_dir
    stored = json.loads((session_dir / SUMMARY_NAME).read_text())
    assert stored["logBytes"] == log.path.stat().st_size and stored["lastSeq"] == log.last_seq
    summary = read_summary(session_dir, "s1", DEFAULTS)
    assert summary.settings == {"approvalPolicy": "never", "sandbox": "workspace-write",
                                "owner": 1000, "name": None}
    assert (summary.title, summary.lastSeq) == ("a title", log.last_seq)
    stale = (session_dir / SUMMARY_NAME).read_bytes()
    more = await SessionLog.open_for_write(state_dir, "s1")
    more.append("sandbox/mode", {"mode": "read-only", "source": "config"})
    await more.aclose()
    (session_dir / SUMMARY_NAME).write_bytes(stale)  # as if the last rewrite was lost
    fresh = read_summary(session_dir, "s1", DEFAULTS)
    assert fresh.settings["sandbox"] == "read-only" and fresh.lastSeq == more.last_seq
    assert fresh.logBytes == log.path.stat().st_size
    (session_dir / SUMMARY_NAME).write_text('{"v": 1, "sessionId": "other"}')
    assert read_summary(session_dir, "s1", DEFAULTS) == fresh  # ignored: read from the log
    os.unlink(session_dir / SUMMARY_NAME)
    assert read_summary(session_dir, "s1", DEFAULTS) == fresh


async def test_summary_of_a_damaged_tail_is_log_corrupt(state_dir):
    log = await _write(state_dir, 10)
    stale = (log.session_dir / SUMMARY_NAME).read_bytes()
    more = await SessionLog.open_for_write(state_dir, "s1")
    more.append("turn/start", {"turnId": "t"})
    await more.flush()
    await more.aclose()
    (log.session_dir / SUMMARY_NAME).write_bytes(stale)
    offset = json.loads(stale)["logBytes"]
    _flip(log.path, offset + 12)
    with pytest.raises(LogCorrupt):
        read_summary(log.session_dir, "s1", DEFAULTS)


async def test_an_old_log_lists_without_a_summary(state_dir):
    log = SessionLog.create(state_dir, "s1", make_header(), snapshot_every=0)
    log.append("approval/policy", {"policy": "never", "source": "config"})
    await log.aclose()
    os.unlink(log.session_dir / SUMMARY_NAME)
    summary = read_summary(log.session_dir, "s1", DEFAULTS)
    assert summary.settings["approvalPolicy"] == "never" and summary.lastSeq == 0
    assert summary.snapshotOffset is None


def test_frames_helper_matches_trailer_crc(tmp_path):
    # The helper above walks real trailers; keep it honest.
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(b"x\n")
    trailer = encode_trailer(frame)
    assert int.from_bytes(trailer[12:], "little") == zlib.crc32(frame)
    shutil.rmtree(tmp_path, ignore_errors=True)
