"""A daemon restart keeps the sessions and their events (STORAGE.md; issue 2)."""

from __future__ import annotations

import signal
import subprocess

import msgspec

from client.api import connect


async def _all_events(c, sid: str) -> list[dict]:
    out = []
    async for ev in c.iter_events(sid):
        out.append(ev)
    return out


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
        assert infos[s1]["title"] == "first" and infos[s1]["lastSeq"] == infos_before[s1]["lastSeq"]
        after = {s: await _all_events(c, s) for s in (s1, s2)}
        assert after == before
        types = [e["type"] for e in after[s1]]
        assert types[:3] == ["session/owner", "approval/policy", "sandbox/mode"]
        assert "tool/call" in types and types[-1] == "tool/result"
        seqs = [e["seq"] for e in after[s1]]
        assert seqs == list(range(len(seqs)))
        # Settled results are served after the restart, and new calls continue the log.
        assert (await c.wait(s1, cid))["content"] == "persisted\n"
        cid2 = await c.run_tool(s1, "echo again", approved=True)
        assert (await c.wait(s1, cid2))["exitCode"] == 0
        evs = await _all_events(c, s1)
        assert [e["seq"] for e in evs] == list(range(len(evs)))


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


async def test_session_list_notices_a_log_changed_on_disk(daemon, workdir):
    """session.list caches closed sessions' info by the log's size and mtime: a byte flipped
    in place (same size) must still show up as damage on the next list."""
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), title="to be damaged")
        cid = await c.run_tool(sid, "echo some output to make a middle frame", approved=True)
        await c.wait(sid, cid)
        await c.run_tool(sid, "true", approved=True)
    daemon.restart()  # now the session is closed: listed from disk
    async with connect(daemon.socket) as c:
        first = {i["sessionId"]: i for i in await c.list_sessions()}
        assert "damaged" not in first[sid]
        assert {i["sessionId"]: i for i in await c.list_sessions()} == first  # cached, same
        log = daemon.state_dir / "sessions" / sid / "session.v1.jsonl.zst"
        data = bytearray(log.read_bytes())
        data[len(data) // 2] ^= 0x41
        log.write_bytes(bytes(data))
        again = {i["sessionId"]: i for i in await c.list_sessions()}
        assert "damaged" in again[sid]
