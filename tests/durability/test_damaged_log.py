"""A flipped byte inside an earlier frame: that session is listed damaged and refuses to open,
naming the byte offset; every other session keeps working (STORAGE.md §5)."""

from __future__ import annotations

import signal

import pytest

from client.api import connect
from dshd.storage import LogCorrupt, read_log
from protocol.rpc import STORAGE_FAILURE, RpcError

from .helpers import all_events, frames, log_path


async def test_flipped_byte_marks_session_damaged_others_work(daemon, workdir):
    async with connect(daemon.socket) as c:
        bad = await c.create_session(str(workdir), title="to be damaged")
        good = await c.create_session(str(workdir), title="healthy")
        for n in range(3):
            cid = await c.run_tool(bad, f"echo call {n}", approved=True)
            await c.wait(bad, cid)
        cid = await c.run_tool(good, "echo healthy", approved=True)
        await c.wait(good, cid)
        good_before = await all_events(c, good)
    assert daemon.stop(signal.SIGTERM) == 0

    path = log_path(daemon.state_dir, bad)
    spans = frames(path)
    assert len(spans) >= 5
    start, end = spans[2]  # an earlier frame: complete frames follow it
    data = bytearray(path.read_bytes())
    data[(start + end) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt) as info:
        read_log(path.parent, bad)
    assert info.value.offset == start

    daemon.start()
    async with connect(daemon.socket) as c:
        infos = {i["sessionId"]: i for i in await c.list_sessions()}
        assert set(infos) == {bad, good}
        assert f"byte {start}" in infos[bad]["damaged"]
        assert "damaged" not in infos[good]
        for method, params in [
            ("session.get", {"sessionId": bad}),
            ("session.events", {"sessionId": bad}),
            ("tool.run", {"sessionId": bad, "name": "bash", "arguments": {"command": "true"},
                          "approved": True}),
        ]:
            with pytest.raises(RpcError) as err:
                await c.call(method, params)
            assert err.value.code == STORAGE_FAILURE
            assert f"byte {start}" in err.value.message and bad in err.value.message
        # The other session, and a new one, work as usual.
        assert await all_events(c, good) == good_before
        cid = await c.run_tool(good, "echo still fine", approved=True)
        assert (await c.wait(good, cid))["content"] == "still fine\n"
        new = await c.create_session(str(workdir), title="new")
        cid = await c.run_tool(new, "echo new", approved=True)
        assert (await c.wait(new, cid))["exitCode"] == 0
        infos = {i["sessionId"]: i for i in await c.list_sessions()}
        assert set(infos) == {bad, good, new} and "damaged" in infos[bad]
    # The daemon never rewrote the damaged log.
    assert path.read_bytes() == bytes(data)
