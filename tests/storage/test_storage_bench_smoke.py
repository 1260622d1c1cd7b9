"""Smoke test of bench/storage.py in quick mode: it builds real logs, opens them in child
processes and lists the sessions. Asserts what it printed and that the logs it built read back
(correctness only, never time)."""

from __future__ import annotations

import trio

from bench import storage as bench_storage
from dshd.storage import SessionLog, read_summary
from dshd.storage.reader import read_log


def test_quick_run_prints_every_part(capsys) -> None:
    assert bench_storage.main(["--quick", "--sessions", "40"]) == 0
    out = capsys.readouterr().out
    assert "open-20000" in out and "old-20000" in out
    assert "goal open ≤ 2.0 s" in out and "RSS ≤ 100 MB" in out
    assert "40 sessions" in out and "baseline ls + cat" in out
    assert "session.list through a real dshd" in out


def test_built_logs_are_real_and_keep_a_tail_after_their_last_snapshot(tmp_path) -> None:
    trio.run(bench_storage._build, tmp_path, "b1", 3_000, 1_000)
    events = read_log(tmp_path / "sessions" / "b1", "b1", fold=True, check=True)
    assert events.last_seq + 1 >= 3_000 and events.snapshot is not None
    assert len(events.events) >= 3_000 // 4 - 9  # the tail the open must verify

    async def reopen() -> int:
        log = await SessionLog.open_for_write(tmp_path, "b1", repair=True)
        try:
            assert log.repair_state.open_calls == {} and log.last_seq == events.last_seq
            return len(log.tail)
        finally:
            await log.aclose()

    assert trio.run(reopen) == len(events.events)
    bench_storage._small_session(tmp_path / "sessions", "small-1",
                                 bench_storage.zstandard.ZstdCompressor(write_checksum=True))
    summary = read_summary(tmp_path / "sessions" / "small-1", "small-1",
                           {"approvalPolicy": "ask", "sandbox": "read-only", "owner": None})
    assert summary.settings["approvalPolicy"] == "never" and summary.lastSeq == 10  # the snapshot is the last event
    assert read_log(tmp_path / "sessions" / "small-1", "small-1", fold=True,
                    check=True).snapshot is not None
