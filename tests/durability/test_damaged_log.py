"""A flipped byte inside an earlier frame (STORAGE.md §5, §7).

Where the open reads it -- a log without snapshots, as a crash leaves a short session -- that
session is listed damaged and refuses to open, naming the byte offset. Before the last
snapshot (a clean stop ends the log with one) the frame never decides whether new writes are
safe: the session opens and works, and the first read that passes the frame answers the
intact events before it, then -32014 ``LOG_DAMAGED`` naming the offset, and marks the session
damaged (its full SessionInfo plus
``damaged``, PROTOCOL.md §3.1). Either way every other session keeps working and the
damaged bytes are never rewritten."""

from __future__ import annotations

import signal

import pytest

from client.api import connect
from dshd.storage import LogCorrupt, read_log
from protocol.rpc import STORAGE_FAILURE, RpcError

from .helpers import all_events, frame_types, frames, log_path


async def _two_sessions(daemon, workdir) -> tuple[str, str, list[dict]]:
    async with connect(daemon.socket) as c:
        bad = await c.create_session(str(workdir), title="to be damaged")
        good = await c.create_session(str(workdir), title="healthy")
        for n in range(3):
            cid = await c.run_tool(bad, f"echo call {n}", approved=True)
            await c.wait(bad, cid)
        cid = await c.run_tool(good, "echo healthy", approved=True)
        await c.wait(good, cid)
        return bad, good, await all_events(c, good)


def _flip_in_frame(path, index: int) -> tuple[int, bytes]:
    """Flip a byte in the middle of data frame ``index``; (its offset, the new file bytes)."""
    start, end = frames(path)[index]
    data = bytearray(path.read_bytes())
    data[(start + end) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt) as info:
        read_log(path.parent, path.parent.name)
    assert info.value.offset == start
    return start, bytes(data)


def _expect_damage(err: pytest.ExceptionInfo, start: int, sid: str) -> None:
    assert err.value.code == STORAGE_FAILURE
    assert f"byte {start}" in err.value.message and sid in err.value.message


async def _intact_then_damage(c, sid: str, start: int) -> list:
    """``session.events`` of a damaged log: its intact events first (``lastSeq`` one past the
    last of them), then the page at the damage is -32014 LOG_DAMAGED naming the offset."""
    page = await c.call("session.events", {"sessionId": sid})
    events = page["events"]
    assert events and page["lastSeq"] == events[-1]["seq"] + 1
    with pytest.raises(RpcError) as err:
        await c.call("session.events", {"sessionId": sid, "afterSeq": events[-1]["seq"]})
    _expect_damage(err, start, sid)
    assert err.value.data["code"] == "LOG_DAMAGED" and err.value.data["offset"] == start
    return events


async def _others_work(c, workdir, bad: str, good: str, good_before: list[dict]) -> None:
    assert await all_events(c, good) == good_before
    cid = await c.run_tool(good, "echo still fine", approved=True)
    assert (await c.wait(good, cid))["content"] == "still fine\n"
    new = await c.create_session(str(workdir), title="new")
    cid = await c.run_tool(new, "echo new", approved=True)
    assert (await c.wait(new, cid))["exitCode"] == 0
    infos = {i["sessionId"]: i for i in await c.list_sessions()}
    assert set(infos) == {bad, good, new} and "damaged" in infos[bad]
    assert "damaged" not in infos[good] and "damaged" not in infos[new]


async def test_flipped_byte_marks_session_damaged_others_work(daemon, workdir):
    bad, good, good_before = await _two_sessions(daemon, workdir)
    daemon.kill9()  # no clean close: no snapshot, so the open reads (and checks) every frame
    path = log_path(daemon.state_dir, bad)
    assert len(frames(path)) >= 5
    assert not any("log/snapshot" in frame_types(path, span) for span in frames(path))
    start, data = _flip_in_frame(path, 2)  # an earlier frame: complete frames follow it

    daemon.start()
    async with connect(daemon.socket) as c:
        infos = {i["sessionId"]: i for i in await c.list_sessions()}
        assert set(infos) == {bad, good}
        assert f"byte {start}" in infos[bad]["damaged"]
        assert "damaged" not in infos[good]
        await _intact_then_damage(c, bad, start)
        for method, params in [
            ("session.get", {"sessionId": bad}),
            ("tool.run", {"sessionId": bad, "name": "bash", "arguments": {"command": "true"},
                          "approved": True}),
        ]:
            with pytest.raises(RpcError) as err:
                await c.call(method, params)
            _expect_damage(err, start, bad)
        await _others_work(c, workdir, bad, good, good_before)
    # The daemon never rewrote the damaged log.
    assert path.read_bytes() == data


async def test_flipped_byte_before_the_last_snapshot_is_found_by_the_read(daemon, workdir):
    bad, good, good_before = await _two_sessions(daemon, workdir)
    assert daemon.stop(signal.SIGTERM) == 0  # the clean close ends each log with a snapshot
    path = log_path(daemon.state_dir, bad)
    spans = frames(path)
    assert len(spans) >= 5 and frame_types(path, spans[-1]) == ["log/snapshot"]
    start, data = _flip_in_frame(path, 2)

    daemon.start()
    async with connect(daemon.socket) as c:
        infos = {i["sessionId"]: i for i in await c.list_sessions()}
        assert set(infos) == {bad, good} and infos[bad]["title"] == "to be damaged"
        # The open checks the log from the last snapshot on: new writes are safe.
        cid = await c.run_tool(bad, "echo after", approved=True)
        assert (await c.wait(bad, cid))["content"] == "after\n"
        # A read that passes the damaged frame stops there, naming it, and every later one too.
        for _ in range(2):
            await _intact_then_damage(c, bad, start)
        infos = {i["sessionId"]: i for i in await c.list_sessions()}
        assert f"byte {start}" in infos[bad]["damaged"]
        assert infos[bad]["title"] == "to be damaged" and infos[bad]["lastSeq"] >= 0
        info = await c.call("session.get", {"sessionId": bad})
        assert f"byte {start}" in info["damaged"]
        await _others_work(c, workdir, bad, good, good_before)
    # The damaged bytes are never rewritten; the log only grew after them.
    assert path.read_bytes()[: len(data)] == data
