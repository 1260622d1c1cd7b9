"""Small helpers shared by the durability tests."""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio._threads
import zstandard

from dshd.storage import Event, read_log
from dshd.storage.format import LOG_NAME_ZSTD, scan_zstd_frame
from dshd.storage.snapshot import SNAPSHOT_TYPE

#: STORAGE.md §5, verbatim.
OUTCOME_UNKNOWN_TEXT = (
    "it may or may not have run; retry only if read-only or idempotent, "
    "otherwise check the outside world first"
)
NOT_STARTED_TEXT = "interrupted before it started; retry if still needed"

#: Why the fail-closed tests are expected to fail until the barrier is fixed (see report).
BARRIER_BUG = (
    "needs: dshd/barrier.py checkpoint() (and Session._barrier) to catch StorageError inside its nursery: trio wraps it in an ExceptionGroup, so the call settles TOOL_CANCELLED instead of STORAGE_FAILURE and the ExceptionGroup kills the daemon"
)


async def all_events(c, sid: str) -> list[dict]:
    return [ev async for ev in c.iter_events(sid)]


def as_dicts(events: list[Event]) -> list[dict]:
    """Events read from disk, in the shape ``session.events`` answers."""
    return [msgspec.to_builtins(e) for e in events]


def log_path(state_dir: Path, sid: str) -> Path:
    return state_dir / "sessions" / sid / LOG_NAME_ZSTD


def frames(path: Path) -> list[tuple[int, int]]:
    """(start, end) of every zstd data frame in a log (their trailers are skipped)."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        scan = scan_zstd_frame(data, pos)
        assert scan.kind in ("frame", "skippable"), scan
        if scan.kind == "frame":
            out.append((pos, scan.end))
        pos = scan.end
    return out


def frame_types(path: Path, span: tuple[int, int]) -> list[str]:
    """The event types in the zstd data frame at ``span`` (start, end) of a log."""
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes()[slice(*span)])
    return [msgspec.json.decode(line)["type"] for line in raw.splitlines()]


def shown(events: list[Event]) -> list[dict]:
    """Events read from disk, as ``session.events`` answers them: the daemon's own
    ``log/snapshot`` events left out (PROTOCOL.md §3.1: their seqs are holes in a page)."""
    return [e for e in as_dicts(events) if e["type"] != SNAPSHOT_TYPE]


def assert_as_on_disk(events: list[dict], session_dir: Path) -> None:
    """What ``session.events`` answered is exactly the log on disk (read whole and verified:
    seq dense from 0 there, every frame checked) minus its ``log/snapshot`` events, so a
    hole in the answer's seqs is a snapshot and nothing else."""
    on_disk = read_log(session_dir, session_dir.name).events
    assert [e.seq for e in on_disk] == list(range(len(on_disk)))
    assert events == shown(on_disk)


def assert_paired(events: list[dict], session_dir: Path) -> None:
    """`assert_as_on_disk`, and every tool/call has exactly one tool/result."""
    assert_as_on_disk(events, session_dir)
    calls = [e["data"]["callId"] for e in events if e["type"] == "tool/call"]
    results = [e["data"]["callId"] for e in events if e["type"] == "tool/result"]
    assert len(calls) == len(set(calls))
    assert sorted(calls) == sorted(set(results) & set(calls)) and len(results) == len(set(results))


class ThreadSpawnSwitch:
    """Makes trio's worker-thread spawn fail, as ``RLIMIT_NPROC`` does, for the storage
    room's blocking work only (its functions: ``LogFile.append``, ``LogFile.publish``, ...,
    named in the worker thread's name ``dshd storage <function>``)."""

    NAMES = ("storage append", "storage publish", "storage open_log", "_write_sync", "retire")

    def __init__(self, monkeypatch) -> None:
        self.failing = False
        self.refused = 0
        real = trio._threads.start_thread_soon

        def start_thread_soon(fn, deliver, name=None):
            if self.failing and any(n in (name or "") for n in self.NAMES):
                self.refused += 1
                raise RuntimeError("can't start new thread")
            return real(fn, deliver, name)

        monkeypatch.setattr(trio._threads, "start_thread_soon", start_thread_soon)
