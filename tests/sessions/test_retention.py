"""``dshd.sessions.retention.trim_outputs`` on a real directory tree: only settled calls'
output goes, oldest first, a half-done removal is finished, a running call is never touched."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dshd.sessions.deletion import tree_bytes
from dshd.sessions.retention import OUTPUT_REMOVED, over_bound_hint, removed_at, trim_outputs


def call(state: Path, sid: str, cid: str, size: int, *, settled_at: float | None,
         marker: bool = False) -> Path:
    d = state / "sessions" / sid / "calls" / cid
    d.mkdir(parents=True)
    (d / "output.raw").write_bytes(b"x" * size)
    (d / "output.raw.1").write_bytes(b"y" * size)
    if settled_at is not None:
        (d / "settled").touch()
        os.utime(d / "settled", (settled_at, settled_at))
    if marker:
        (d / OUTPUT_REMOVED).write_text(json.dumps({"at": 1234, "bytes": 2 * size}))
    return d


def test_only_settled_output_goes_oldest_first_and_a_half_done_one_is_finished(tmp_path):
    half = call(tmp_path, "s1", "half", 10, settled_at=50, marker=True)  # a crash mid-removal
    old = call(tmp_path, "s1", "old", 1000, settled_at=100)
    new = call(tmp_path, "s2", "new", 1000, settled_at=200)
    running = call(tmp_path, "s2", "running", 5000, settled_at=None)
    dirs = tree_bytes(tmp_path) - 14_020  # the directories count, as du -sb counts them
    bound = dirs + 13_000  # 14,020 bytes of files: one removal is enough
    done = trim_outputs(tmp_path, max_bytes=bound)
    assert not list(half.glob("output.raw*")) and removed_at(half) == 1234
    assert not list(old.glob("output.raw*")) and removed_at(old) > 0
    assert json.loads((old / OUTPUT_REMOVED).read_text())["bytes"] == 2000
    assert (new / "output.raw").exists() and removed_at(new) is None
    assert done["removed"] == 2 and done["stateBytes"] <= bound
    # Even with nothing allowed, a running call's output stays; the bound is only a wish then.
    done = trim_outputs(tmp_path, max_bytes=1)
    assert (running / "output.raw").stat().st_size == 5000 and removed_at(running) is None
    assert not (new / "output.raw").exists() and done["stateBytes"] > 1


def test_under_the_bound_nothing_is_touched(tmp_path):
    c = call(tmp_path, "s1", "c", 100, settled_at=1)
    assert trim_outputs(tmp_path, max_bytes=tree_bytes(tmp_path))["removed"] == 0
    assert (c / "output.raw").exists() and removed_at(c) is None


def test_the_per_pass_limit_bounds_the_work(tmp_path):
    for i in range(5):
        call(tmp_path, "s1", f"c{i}", 100, settled_at=i + 1)
    assert trim_outputs(tmp_path, max_bytes=1, limit=2)["removed"] == 2
    assert [removed_at(tmp_path / "sessions/s1/calls" / f"c{i}") is not None
            for i in range(5)] == [True, True, False, False, False]


def test_a_tombstone_being_removed_is_never_touched(tmp_path):
    c = call(tmp_path, ".deleting-s1", "c", 100, settled_at=1)
    assert trim_outputs(tmp_path, max_bytes=1)["removed"] == 0
    assert (c / "output.raw").exists() and removed_at(c) is None


def test_still_over_the_bound_says_what_it_counted(tmp_path):
    """Past every removal the pass says what holds the state over its bound: a running call's
    output (never removed while it runs) is named as that, not as "the logs"."""
    running = call(tmp_path, "s1", "running", 5000, settled_at=None)
    log = tmp_path / "sessions" / "s1" / "session.v1.jsonl.zst"
    log.write_bytes(b"z" * 300)
    other = tree_bytes(tmp_path) - 10_000  # the log and the directories
    done = trim_outputs(tmp_path, max_bytes=1000)
    assert done["stateBytes"] == 10_000 + other and done["runningOutputBytes"] == 10_000
    hint = over_bound_hint(done, 1000)
    assert "10000 bytes are running calls' output" in hint and "never removed" in hint
    assert f"{other} bytes are logs, summaries and other files" in hint
    assert "the logs alone" not in hint
    (running / "settled").touch()  # settled: its output goes, the logs are what is left
    done = trim_outputs(tmp_path, max_bytes=100)
    marker = (running / OUTPUT_REMOVED).stat().st_size  # written after the state was counted
    assert done["runningOutputBytes"] == 0
    assert done["stateBytes"] == tree_bytes(tmp_path) - marker
    assert not list(running.glob("output.raw*"))
    assert "0 bytes are running calls' output" in over_bound_hint(done, 100)
