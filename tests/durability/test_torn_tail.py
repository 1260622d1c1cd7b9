"""A torn tail (the log cut short while dshd is stopped) opens with its complete records, and
the session carries on durably (STORAGE.md §5)."""

from __future__ import annotations

import os
import signal

import pytest

from client.api import connect
from dshd.storage import read_log

from .helpers import all_events, as_dicts, assert_paired, frames, log_path


@pytest.mark.parametrize("cut", [3, 9], ids=["checksum-cut", "block-cut"])
async def test_torn_tail_keeps_complete_records_and_continues(daemon, workdir, cut):
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), title="torn")
        other = await c.create_session(str(workdir), title="untouched")
        first = await c.run_tool(sid, "echo first", approved=True)
        assert (await c.wait(sid, first))["exitCode"] == 0
        last = await c.run_tool(sid, "echo last", approved=True)
        assert (await c.wait(sid, last))["exitCode"] == 0
        before = await all_events(c, sid)
        other_before = await all_events(c, other)
    assert daemon.stop(signal.SIGTERM) == 0

    path = log_path(daemon.state_dir, sid)
    start, end = frames(path)[-1]  # the frame holding the last tool/result alone
    assert end - start > cut + 8
    os.truncate(path, end - cut)
    torn = read_log(path.parent, sid)
    assert torn.torn and torn.valid_bytes == start
    kept = as_dicts(torn.events)
    assert kept == before[: len(kept)]
    if cut == 3:  # only the checksum is gone: the last block decodes, the result is kept
        assert kept == before
    else:  # the last block is cut: the tool/result of the last call is gone
        assert kept == before[:-1]

    daemon.start()
    async with connect(daemon.socket) as c:
        # The torn-off call settles in a task of the reopened session: its result first.
        result = await c.wait(sid, last)
        after = await all_events(c, sid)
        assert after[: len(kept)] == kept
        assert_paired(after)
        if cut == 3:
            assert after == before and result["content"] == "last\n"
        else:
            # The call whose result was torn off is settled again from its host's exit
            # record (HOST.md §7: real exit code, a note); it is never re-run.
            assert [e["type"] for e in after[len(kept):]] == ["tool/result"]
            assert result["exitCode"] == 0 and "errorCode" not in result, result
            assert result["content"] == "last\n" and "call host" in result["message"]
        assert await all_events(c, other) == other_before
        # The next call lands after the kept records, and is durable once tool.wait answers.
        nxt = await c.run_tool(sid, "echo next", approved=True)
        assert (await c.wait(sid, nxt))["content"] == "next\n"
        final = await all_events(c, sid)
        assert final[: len(after)] == after
    daemon.kill9()  # no graceful flush: what tool.wait acknowledged must already be on disk
    clean = read_log(path.parent, sid)
    assert not clean.torn and as_dicts(clean.events) == final

    daemon.start()
    async with connect(daemon.socket) as c:
        assert await all_events(c, sid) == final
        assert (await c.wait(sid, nxt))["content"] == "next\n"


async def test_torn_plain_log_line(root, workdir):
    """The same for an uncompressed log: a last line without its newline."""
    from dshd.testing import DshdProcess

    config = root / "dshd.toml"
    config.write_text('compression = "none"\n')
    daemon = DshdProcess(root, extra_args=["--config", str(config)])
    daemon.start()
    try:
        async with connect(daemon.socket) as c:
            sid = await c.create_session(str(workdir))
            cid = await c.run_tool(sid, "echo plain", approved=True)
            await c.wait(sid, cid)
            before = await all_events(c, sid)
        assert daemon.stop() == 0
        path = daemon.state_dir / "sessions" / sid / "session.v1.jsonl"
        data = path.read_bytes()
        path.write_bytes(data[:-7])  # the last line (the tool/result) loses its end
        daemon.start()
        async with connect(daemon.socket) as c:
            await c.wait(sid, cid)  # settled again in a task of the reopened session
            after = await all_events(c, sid)
            assert after[:-1] == before[:-1]
            # Settled again from the host's exit record (HOST.md §7), not lost.
            assert after[-1]["data"]["exitCode"] == before[-1]["data"]["exitCode"]
            assert "call host" in after[-1]["data"]["message"]
            nxt = await c.run_tool(sid, "echo again", approved=True)
            assert (await c.wait(sid, nxt))["exitCode"] == 0
            final = await all_events(c, sid)
        daemon.kill9()
        read = read_log(path.parent, sid)
        assert not read.torn and as_dicts(read.events) == final
    finally:
        daemon.close(signal.SIGKILL)
