"""A daemon restart keeps the sessions and their events (STORAGE.md; issue 2)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import msgspec
import pytest

from client.api import connect
from dshd.storage import iter_all
from dshd.storage.format import TRAILER_SIZE
from protocol.rpc import STORAGE_FAILURE, RpcError
from tests.durability.helpers import frames


async def _all_events(c, sid: str) -> list[dict]:
    out = []
    async for ev in c.iter_events(sid):
        out.append(ev)
    return out


def _snapshot_seqs(daemon, sid: str) -> set[int]:
    """The seqs of the session's ``log/snapshot`` events on disk (STORAGE.md §7)."""
    return {ev.seq for ev in iter_all(daemon.state_dir / "sessions" / sid, sid)
            if ev.type == "log/snapshot"}


def _assert_dense_but_snapshots(daemon, sid: str, events: list[dict], last_seq: int) -> None:
    """session.events leaves out the daemon's log/snapshot events, and nothing else: the seqs
    it returns and the snapshots' seqs on disk are every seq through ``last_seq``, once each
    (PROTOCOL.md §3.1)."""
    seqs = [e["seq"] for e in events]
    snapshots = _snapshot_seqs(daemon, sid)
    assert seqs == sorted(set(seqs)) and not snapshots & set(seqs)
    assert sorted(set(seqs) | snapshots) == list(range(last_seq + 1)), (seqs, snapshots)
    assert "log/snapshot" not in {e["type"] for e in events}


async def test_restart_keeps_sessions_and_events(daemon, workdir):
    async with connect(daemon.socket) as c:
        s1 = await c.create_session(str(workdir), title="first")
        s2 = await c.create_session(str(workdir), title="second")
        cid = await c.run_tool(s1, "echo persisted; exit 7", approved=True)
        result = await c.wait(s1, cid)
        assert result["exitCode"] == 7
        before = {s: await _all_events(c, s) for s in (s1, s2)}
        infos_before = {i["sessionId"]: i for i in await c.list_sessions()}
    assert daemon.stop(signal.SIGTERM) == 0
    daemon.start()
    async with connect(daemon.socket) as c:
        infos = {i["sessionId"]: i for i in await c.list_sessions()}
        assert set(infos) == {s1, s2}
        assert infos[s1]["title"] == "first"
        # The clean close wrote one log/snapshot (STORAGE.md §7) after the last event; it
        # takes the next seq, and lastSeq counts it (PROTOCOL.md §3.1).
        for s in (s1, s2):
            last_before = infos_before[s]["lastSeq"]
            assert _snapshot_seqs(daemon, s) == {last_before + 1}
            assert infos[s]["lastSeq"] == last_before + 1
        after = {s: await _all_events(c, s) for s in (s1, s2)}
        assert after == before  # the snapshot is not an event a client is given
        types = [e["type"] for e in after[s1]]
        assert types[:3] == ["session/owner", "approval/policy", "sandbox/mode"]
        assert "tool/call" in types and types[-1] == "tool/result"
        for s in (s1, s2):
            _assert_dense_but_snapshots(daemon, s, after[s], infos[s]["lastSeq"])
        # Settled results are served after the restart, and new calls continue the log.
        assert (await c.wait(s1, cid))["content"] == "persisted\n"
        cid2 = await c.run_tool(s1, "echo again", approved=True)
        assert (await c.wait(s1, cid2))["exitCode"] == 0
        evs = await _all_events(c, s1)
        assert evs[: len(after[s1])] == after[s1] and evs[-1]["type"] == "tool/result"
        assert evs[-1]["seq"] == (await c.get_session(s1))["lastSeq"]
        _assert_dense_but_snapshots(daemon, s1, evs, evs[-1]["seq"])


async def test_log_is_plain_jsonl_under_zstdcat(daemon, workdir):
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), title="zstd")
        cid = await c.run_tool(sid, "echo on disk", approved=True)
        await c.wait(sid, cid)
    log = daemon.state_dir / "sessions" / sid / "session.v1.jsonl.zst"
    out = subprocess.run(["zstd", "-dc", str(log)], capture_output=True, check=True).stdout
    lines = [msgspec.json.decode(line) for line in out.splitlines()]
    assert lines[0]["type"] == "session" and lines[0]["id"] == sid and lines[0]["version"] == 1
    results = [line for line in lines[1:] if line["type"] == "tool/result"]
    assert results and results[0]["data"]["content"] == "on disk\n"


async def test_graceful_stop_detaches_running_calls(daemon, workdir):
    """A SIGTERM (``on_stop = "detach"``, the default) leaves the call running under its host;
    the restarted daemon adopts it (HOST.md §7) and a cancel then ends it."""
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        cid = await c.run_tool(sid, "echo started; sleep 100", approved=True)
        sub = await c.subscribe(sid)
        async for view in sub:
            tool = view["tools"].get(cid)
            if tool and tool["output"]["content"][0]["text"] == "started\n":
                break
    assert daemon.stop(signal.SIGTERM) == 0
    daemon.start()
    async with connect(daemon.socket) as c:
        assert (await c.get_session(sid))["running"] == 1  # adopted: still running
        assert await c.cancel(sid, cid) is True
        result = await c.wait(sid, cid)
    assert result["errorCode"] == "TOOL_CANCELLED" and result["isError"] is True
    assert result["content"].startswith("started\n")


async def _closed_session(daemon, workdir, title: str) -> tuple[str, Path]:
    """A session with a middle frame, closed by a restart (listed from disk, its summary
    covering the whole log); (its id, its log)."""
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), title=title)
        cid = await c.run_tool(sid, "echo some output to make a middle frame", approved=True)
        await c.wait(sid, cid)
        last = await c.run_tool(sid, "true", approved=True)
        await c.wait(sid, last)  # settled before the stop: nothing resumes after the start
    daemon.restart()
    return sid, daemon.state_dir / "sessions" / sid / "session.v1.jsonl.zst"


def _flip(log: Path, at: int) -> None:
    """One byte changed in place: same size, same inode, a new mtime."""
    data = bytearray(log.read_bytes())
    data[at] ^= 0x41
    log.write_bytes(bytes(data))


async def test_session_list_notices_a_log_changed_on_disk(daemon, workdir):
    """session.list caches closed sessions' info by the log's (size, mtime, inode): a byte
    changed in place (same size) in what a list reads -- the trailer the summary's
    ``logBytes`` names (STORAGE.md §7) -- must show up as damage on the next list."""
    sid, log = await _closed_session(daemon, workdir, "to be damaged")
    async with connect(daemon.socket) as c:
        first = {i["sessionId"]: i for i in await c.list_sessions()}
        assert "damaged" not in first[sid]
        assert {i["sessionId"]: i for i in await c.list_sessions()} == first  # cached, same
        size = log.stat().st_size
        _flip(log, size - TRAILER_SIZE)  # the last trailer's magic
        assert log.stat().st_size == size
        again = {i["sessionId"]: i for i in await c.list_sessions()}
        assert f"the trailer at byte {size - TRAILER_SIZE}" in again[sid]["damaged"], again[sid]


async def test_damage_before_the_summary_end_is_found_when_read(daemon, workdir):
    """A byte flipped inside a frame the summary covers is not read by session.list (it
    trusts the summary, STORAGE.md §7); the read that passes the frame finds it, answers the
    intact events before it and then LOG_DAMAGED naming the byte, and from then on the session is listed damaged (PROTOCOL.md
    §3.1)."""
    sid, log = await _closed_session(daemon, workdir, "damaged in the middle")
    spans = frames(log)
    assert len(spans) >= 4
    start, end = spans[len(spans) // 2]  # a middle frame, before the close snapshot
    _flip(log, (start + end) // 2)
    async with connect(daemon.socket) as c:
        with pytest.raises(RpcError) as err:
            await _all_events(c, sid)
        assert err.value.code == STORAGE_FAILURE
        assert err.value.data["code"] == "LOG_DAMAGED" and err.value.data["offset"] == start
        assert f"byte {start}" in err.value.message and sid in err.value.message
        listed = {i["sessionId"]: i for i in await c.list_sessions()}
        assert f"byte {start}" in listed[sid]["damaged"], listed[sid]
        assert listed[sid]["title"] == "damaged in the middle"  # its full SessionInfo kept
