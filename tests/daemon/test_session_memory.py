"""A session longer than its memory (issue 14): old events, old results and the model's history
come from disk, correctly; memory stays bounded; a damaged old frame marks the session
damaged and touches no other session. Harness: ``conftest.py``.

The daemon keeps ``results_cache`` = 16 settled results and writes a ``log/snapshot`` every
20 events, so after 40 calls most of the session is on disk only (the writer's ``tail`` holds
the events since the last durable snapshot)."""

from __future__ import annotations

import json

import pytest
import trio

from dshd.storage.reader import read_log

from .conftest import LIVENESS, WireError, running_daemon

SMALL = {"results_cache": 16, "snapshot_every_events": 20}
CALLS = 40
TWO_TURNS = [{"text": "first answer"}, {"text": "second answer"}]


async def _calls(wire, sid: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        cid = await wire.run(sid, f"echo call {i}")
        assert (await wire.wait(sid, cid))["content"] == f"call {i}\n"
        ids.append(cid)
    return ids


async def _all_events(wire, sid: str, page: int) -> list[dict]:
    out: list[dict] = []
    after = -1
    while True:
        got = (await wire.call("session.events", {"sessionId": sid, "afterSeq": after,
                                                  "limit": page}))["events"]
        if not got:
            return out
        out += got
        after = got[-1]["seq"]


def _on_disk(daemon, sid: str) -> list[dict]:
    """Every event of the log as the full reader sees it, minus the daemon's snapshots."""
    read = read_log(daemon.state_dir / "sessions" / sid, sid)
    return [json.loads(json.dumps({"seq": e.seq, "type": e.type, "data": e.data}))
            for e in read.events if e.type != "log/snapshot"]


async def _on_disk_once(daemon, sid: str, predicate, what: str) -> list[dict]:
    """`_on_disk` once ``predicate(events)`` holds: the lane shows a change before the events
    behind it are durable (a turn leaves the lane, then its ``turn/end`` is flushed)."""
    with trio.move_on_after(LIVENESS):
        while True:
            events = _on_disk(daemon, sid)
            if predicate(events):
                return events
            await trio.sleep(0.01)
    raise AssertionError(f"no {what} on disk within {LIVENESS:g} virtual seconds")


def _key(events: list[dict]) -> list[tuple]:
    return [(e["seq"], e["type"], json.dumps(e["data"], sort_keys=True)) for e in events]


@pytest.mark.parametrize("daemon_overrides", [SMALL])
@pytest.mark.parametrize("model_script", [TWO_TURNS])
async def test_a_long_session_answers_events_waits_and_history_from_disk(
        daemon, daemon_clock, nursery, tmp_path):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire, env={"SOAK": "1"})
    lane = await wire.subscribe(sid)
    turn1 = (await wire.call("turn.start", {"sessionId": sid, "input": "one"}))["turnId"]
    await wire.wait_lane(lane, lambda l: l.value["turn"] is None, "the first turn's end")
    ids = await _calls(wire, sid, CALLS)
    session = daemon.daemon.registry.opened(sid)
    assert session is not None
    first_tail = session._log.tail[0].seq  # the first event still held in memory
    assert first_tail > 100, "the test needs most events out of memory"

    # session.events: every event, in order, whatever the page size, equal to the log's
    for page in (7, 1000):
        got = await _all_events(wire, sid, page)
        assert _key(got) == _key(_on_disk(daemon, sid)), page
    # tool.wait on the oldest call: its result fell out of memory and is read back by seq
    assert (await wire.wait(sid, ids[0], timeout=0))["content"] == "call 0\n"
    # the model's history holds the first turn (only on disk now): the scripted model
    # counts the assistant messages it is sent, so a history without them answers "first"
    turn2 = (await wire.call("turn.start", {"sessionId": sid, "input": "two"}))["turnId"]
    await wire.wait_lane(lane, lambda l: l.value["turn"] is None, "the second turn's end")
    logged = await _on_disk_once(
        daemon, sid, lambda evs: any(e["type"] == "turn/end" and e["data"]["turnId"] == turn2
                                     for e in evs), "turn/end of the second turn")
    answers = [(e["data"]["turnId"], e["data"]["text"]) for e in logged
               if e["type"] == "message/assistant"]
    assert answers == [(turn1, "first answer"), (turn2, "second answer")]

    # After a restart: the snapshot gives the settings, the call index and recent back
    await daemon.stop()
    async with running_daemon(tmp_path, daemon.config, daemon_clock) as again:
        reader = await again.connect(nursery=nursery)
        info = await reader.call("session.get", {"sessionId": sid})
        last = read_log(again.state_dir / "sessions" / sid, sid).events[-1]
        assert last.type == "log/snapshot"  # written at the clean close
        assert info["lastSeq"] == last.seq and "damaged" not in info
        assert (await reader.wait(sid, ids[1], timeout=0))["content"] == "call 1\n"
        assert (await reader.wait(sid, ids[-1], timeout=0))["content"] == f"call {CALLS - 1}\n"
        # the id is known (the snapshot's call index): nothing runs again; its digest too:
        # the same call is `existing`, another command under its id CALL_ID_REUSED
        dup = await reader.call("tool.run", {"sessionId": sid, "name": "bash", "callId": ids[2],
                                            "arguments": {"command": "echo call 2"}})
        assert dup == {"callId": ids[2], "existing": True}
        other = await reader.error("tool.run", {"sessionId": sid, "name": "bash",
                                                "callId": ids[2],
                                                "arguments": {"command": "echo again"}})
        assert other.code == -32602 and other.data["code"] == "CALL_ID_REUSED", other
        lane2 = await reader.subscribe(sid)
        recent = [r["callId"] for r in lane2.value["recent"]]
        assert recent == list(reversed(ids))[:len(recent)] and len(recent) == 20
        check = await reader.run(sid, "env")
        assert "SOAK=1" in (await reader.wait(sid, check))["content"]
        assert _key(await _all_events(reader, sid, 50)) == _key(_on_disk(again, sid))


@pytest.mark.parametrize("daemon_overrides", [SMALL])
async def test_memory_stays_bounded_however_many_calls(daemon, daemon_clock, nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    await _calls(wire, sid, CALLS)
    session = daemon.daemon.registry.opened(sid)
    stats = session._calls.known.statistics()
    assert stats["known"] == CALLS
    assert stats["cached"] <= 16 and stats["unsettled"] == 0 and stats["waiters"] == 0
    assert stats["logged"] == 0
    tail = len(session._log.tail)
    assert tail <= 2 * 20 + 8, tail  # one snapshot's worth plus the batch being written
    more = await _calls(wire, sid, CALLS)
    stats = session._calls.known.statistics()
    assert stats["known"] == 2 * CALLS and stats["cached"] <= 16 and stats["waiters"] == 0
    assert len(session._log.tail) <= 2 * 20 + 8
    assert (await wire.wait(sid, more[0], timeout=0))["content"] == "call 0\n"


def _flip_an_old_frame(log_path, before: int) -> int:
    """Flip one byte inside a zstd frame that starts after the header frame and ends before
    byte ``before`` (the last snapshot); its offset."""
    data = bytearray(log_path.read_bytes())
    magic = b"\x28\xb5\x2f\xfd"
    starts = []
    at = data.find(magic)
    while at >= 0:
        starts.append(at)
        at = data.find(magic, at + 1)
    for a, b in zip(starts[1:], starts[2:]):
        if b - a > 60 and b < before:
            data[a + 30] ^= 0x55
            log_path.write_bytes(bytes(data))
            return a
    raise AssertionError("no old frame to damage")


async def _damage_after_intact(reader, sid: str):
    """The error of ``session.events`` at a damaged frame, after the intact page before it
    (or at once when the damage comes first)."""
    try:
        page = await reader.call("session.events", {"sessionId": sid, "afterSeq": -1})
    except WireError as first:  # the first frame after the header is the damaged one
        return first
    if page["events"]:
        assert page["lastSeq"] == page["events"][-1]["seq"] + 1
    after = page["events"][-1]["seq"] if page["events"] else -1
    return await reader.error("session.events", {"sessionId": sid, "afterSeq": after})


@pytest.mark.parametrize("daemon_overrides", [SMALL])
async def test_a_damaged_old_frame_marks_the_session_damaged_and_nothing_else(
        daemon, daemon_clock, nursery, tmp_path):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    other = await daemon.create_session(wire)
    ids = await _calls(wire, sid, CALLS)
    await _calls(wire, other, 2)
    await daemon.stop()
    session_dir = daemon.state_dir / "sessions" / sid
    snapshot_offset = json.loads((session_dir / "summary.json").read_text())["snapshotOffset"]
    [log_path] = list(session_dir.glob("session.v*.jsonl.zst"))
    _flip_an_old_frame(log_path, snapshot_offset)

    async with running_daemon(tmp_path, daemon.config, daemon_clock) as again:
        reader = await again.connect(nursery=nursery)
        # The open verifies from the last snapshot on: the session opens and new work is safe.
        info = await reader.call("session.get", {"sessionId": sid})
        assert "damaged" not in info
        # A read of the old frames finds the damage: the intact events before it, then
        # -32014 LOG_DAMAGED, and it is remembered.
        bad = await _damage_after_intact(reader, sid)
        assert bad.code == -32014 and bad.data["code"] == "LOG_DAMAGED", bad
        old = await reader.error("tool.wait", {"sessionId": sid, "callId": ids[0],
                                               "timeout": 0})
        assert old.code == -32014 and old.data == {"code": "LOG_DAMAGED"}
        info = await reader.call("session.get", {"sessionId": sid})
        assert "is damaged at byte" in info["damaged"]
        listed = {s["sessionId"]: s for s in
                  (await reader.call("session.list", {}))["sessions"]}
        assert "damaged" in listed[sid] and "damaged" not in listed[other]
        # The tail still works, in the damaged session and in the other one.
        assert (await reader.wait(sid, ids[-1], timeout=0))["content"] == f"call {CALLS - 1}\n"
        for s in (sid, other):
            cid = await reader.run(s, "echo still")
            assert (await reader.wait(s, cid))["content"] == "still\n"


LISTED = 40


async def test_listing_closed_sessions_is_one_thread_hop_and_reads_nothing_unchanged(
        daemon, daemon_clock, autojump, nursery, tmp_path):
    """session.list of many closed sessions: their summaries are read in ONE worker thread
    (not one hop each: at 10,000 sessions the hops alone took seconds), and a repeat list
    with nothing changed reads no summary and no log (the (size, mtime_ns, ino) cache)."""
    wire = await daemon.connect(nursery=nursery)
    sids = [await daemon.create_session(wire, title=f"s{i}") for i in range(LISTED)]
    await daemon.stop()
    async with running_daemon(tmp_path, daemon.config, daemon_clock) as again:
        reader = await again.connect(nursery=nursery)
        listing = again.daemon.registry._listing
        hops = []
        for _ in range(2):
            before, reads = autojump.threads_seen, listing.reads
            rows = (await reader.call("session.list", {}))["sessions"]
            hops.append(autojump.threads_seen - before)
            assert sorted(r["sessionId"] for r in rows) == sorted(sids)
            assert {r["title"] for r in rows} == {f"s{i}" for i in range(LISTED)}
            assert all("damaged" not in r and r["running"] == 0 for r in rows)
            if _ == 0:
                assert listing.reads - reads == LISTED  # the first list reads each summary
            else:
                assert listing.reads == reads  # nothing changed: stats only
        # the session directories and the closed sessions, each in one hop (was 1 + 40)
        assert hops == [2, 2], hops


def _snapshot_offsets(log_path) -> list[int]:
    """Offsets of the snapshot frames, newest first (walking back over the trailers)."""
    import zstandard

    data, dctx, pos, out = log_path.read_bytes(), zstandard.ZstdDecompressor(), None, []
    pos = len(data)
    while pos > 16:
        start = pos - 16 - int.from_bytes(data[pos - 8: pos - 4], "little")
        if start <= 0:
            return out
        if b'"type":"log/snapshot"' in dctx.decompressobj().decompress(data[start: pos - 16]):
            out.append(start)
        pos = start
    return out


@pytest.mark.parametrize("daemon_overrides", [SMALL])
async def test_a_damaged_old_snapshot_loses_no_call_id_and_marks_the_session_damaged(
        daemon, daemon_clock, nursery, tmp_path):
    """An old snapshot's frame holds a delta of the call index (STORAGE.md §7): with it
    damaged, the open rebuilds that delta from the events it covered, so every call id is
    still known (no duplicate runs); a read of the old frames finds the damage and marks
    the session damaged; the other session is not touched."""
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    other = await daemon.create_session(wire)
    ids = await _calls(wire, sid, CALLS)
    await daemon.stop()
    [log_path] = list((daemon.state_dir / "sessions" / sid).glob("session.v*.jsonl.zst"))
    offsets = _snapshot_offsets(log_path)
    assert len(offsets) >= 3
    data = bytearray(log_path.read_bytes())
    data[offsets[len(offsets) // 2] + 20] ^= 0x40  # one in the middle of the chain
    log_path.write_bytes(bytes(data))

    async with running_daemon(tmp_path, daemon.config, daemon_clock) as again:
        reader = await again.connect(nursery=nursery)
        for i, cid in enumerate(ids):  # every id and its digest are known: nothing runs again
            dup = await reader.call("tool.run", {"sessionId": sid, "name": "bash",
                                                "callId": cid,
                                                "arguments": {"command": f"echo call {i}"}})
            assert dup == {"callId": cid, "existing": True}, cid
            reused = await reader.error("tool.run", {"sessionId": sid, "name": "bash",
                                                     "callId": cid,
                                                     "arguments": {"command": "echo again"}})
            assert reused.data["code"] == "CALL_ID_REUSED", (cid, reused)
        bad = await _damage_after_intact(reader, sid)
        assert bad.code == -32014 and bad.data["code"] == "LOG_DAMAGED", bad
        listed = {s["sessionId"]: s for s in
                  (await reader.call("session.list", {}))["sessions"]}
        assert "is damaged at byte" in listed[sid]["damaged"]
        assert "damaged" not in listed[other]
        for s in (sid, other):
            cid = await reader.run(s, "echo still")
            assert (await reader.wait(s, cid))["content"] == "still\n"
