"""A torn tail (the log cut short while dshd is stopped) opens with its complete records, and
the session carries on durably (STORAGE.md §5). A clean stop ends the log with a snapshot
frame (STORAGE.md §7): cutting the frame of the last tool/result means the crash came before
that snapshot, so the cut drops it too; a cut snapshot alone loses no event."""

from __future__ import annotations

import os
import signal

import pytest

from client.api import connect
from dshd.storage import read_log
from dshd.storage.snapshot import SNAPSHOT_TYPE

from .helpers import all_events, assert_as_on_disk, assert_paired, frame_types, frames, log_path, shown


@pytest.mark.parametrize("frame,cut", [("result", 3), ("result", 9), ("snapshot", 9)],
                         ids=["checksum-cut", "block-cut", "snapshot-cut"])
async def test_torn_tail_keeps_complete_records_and_continues(daemon, workdir, frame, cut):
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
    spans = frames(path)
    assert frame_types(path, spans[-1]) == [SNAPSHOT_TYPE]  # the clean stop's snapshot
    assert frame_types(path, spans[-2]) == ["tool/result"]  # the last tool/result, alone
    start, end = spans[-1] if frame == "snapshot" else spans[-2]
    assert end - start > cut + 8
    os.truncate(path, end - cut)
    torn = read_log(path.parent, sid)
    assert torn.torn and torn.valid_bytes == start
    kept = shown(torn.events)
    assert [e.seq for e in torn.events] == list(range(len(torn.events)))
    assert kept == before[: len(kept)]
    whole = cut == 3 or frame == "snapshot"
    if whole:  # only the checksum (or the snapshot) is gone: every event is kept
        assert kept == before
    else:  # the last block is cut: the tool/result of the last call is gone
        assert kept == before[:-1]

    daemon.start()
    async with connect(daemon.socket) as c:
        # The torn-off call settles in a task of the reopened session: its result first.
        result = await c.wait(sid, last)
        after = await all_events(c, sid)
        assert after[: len(kept)] == kept
        assert_paired(after, path.parent)
        if whole:
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
    assert not clean.torn
    assert_as_on_disk(final, path.parent)

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
        lines = path.read_bytes().splitlines(keepends=True)
        # The clean stop's snapshot is the last line; the crash came before it, while the
        # tool/result's line (the one before) was being written: it loses its end.
        assert SNAPSHOT_TYPE.encode() in lines[-1] and b'"tool/result"' in lines[-2]
        path.write_bytes(b"".join(lines[:-1])[:-7])
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
        assert not read.torn
        assert_as_on_disk(final, path.parent)
    finally:
        daemon.close(signal.SIGKILL)
