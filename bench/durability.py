"""Durability bench: how fast events become durable through `SessionLog`, next to the disk.

Theory of operation: in one temp directory on the file system under test, in one run,

1. **1 flusher**: append one event and ``flush()`` it, N times: every event pays one frame
   write + one fsync. Reports durable events/s and flush latency p50/p99.
2. **8 flushers**: 8 tasks do the same concurrently on one log; group commit lets a flush
   that finds its event already written by another return without a write, so events per
   fsync rises above 1. Same figures, plus events per fsync.
3. **bare baselines**: ``os.write`` + ``os.fsync`` of chunks of the log's frame size into a
   plain file: the disk's own price of one durable append, with the same thread count as the
   run it is compared with -- 1 thread for the 1 flusher, 8 threads on one file for the 8
   flushers (the disk merges concurrent fsyncs too: comparing 8 flushers, whose group commit
   puts several events in one fsync, with one thread that pays one fsync per chunk flattered
   the log). Each line prints events (chunks) per fsync beside its rate.

The runs are interleaved in rounds (rotating order), so drift in the disk's speed during
the run weighs on all of them alike.

Events are ``tool/result``-shaped with ~300 bytes of varied text (zstd level 3, checksums
on, like the daemon). Blocking file work runs in worker threads, as in the daemon. Nothing
here asserts on time; the figures depend on the disk (tmpfs makes fsync free: it says so).
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import string
import tempfile
import time
from pathlib import Path

import trio

from dshd.storage import Header, SessionLog


def _fs_type(path: Path) -> str:
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if str(path).startswith(mnt.rstrip("/") + "/") or str(path) == mnt:
                    if len(mnt) >= len(best):
                        best, kind = mnt, parts[2]
    except OSError:
        pass
    return f"{kind} at {best or '?'}"


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _payload(rng: random.Random, i: int) -> dict:
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(45)]
    return {
        "callId": f"c-{i:08d}",
        "isError": False,
        "content": " ".join(words) + "\n",
        "details": {"truncation": {"truncated": False, "totalBytes": 300, "totalLines": 1}},
        "exitCode": 0,
    }


class _LogRun:
    """One log and ``flushers`` tasks that each append one event and flush it, repeatedly."""

    def __init__(self, base: Path, name: str, flushers: int, seed: int) -> None:
        self.base, self.name, self.flushers = base, name, flushers
        self.rng = random.Random(seed)
        self.latencies: list[float] = []
        self.seconds = 0.0
        self.events = 0
        self.log: SessionLog | None = None
        self.start_stats: dict = {}

    async def open(self) -> None:
        header = Header(id=self.name, createdAt=int(time.time() * 1000), cwd=str(self.base),
                        title=self.name)
        self.log = SessionLog.create(self.base, self.name, header)
        self.log.append("approval/policy", {"policy": "ask", "source": "bench"})
        await self.log.flush()  # publish (header frame + first batch): not measured
        self.start_stats = self.log.statistics()

    async def round(self, events: int) -> None:
        log = self.log
        assert log is not None
        per = events // self.flushers
        payloads = [_payload(self.rng, self.events + i) for i in range(per * self.flushers)]

        async def flusher(k: int) -> None:
            for i in range(per):
                t0 = time.perf_counter()
                log.append("tool/result", payloads[k * per + i])
                await log.flush()
                self.latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for k in range(self.flushers):
                nursery.start_soon(flusher, k)
        self.seconds += time.perf_counter() - t0
        self.events += per * self.flushers

    async def close(self) -> dict:
        log = self.log
        assert log is not None
        stats = log.statistics()
        await log.aclose()
        frames = stats["frames"] - self.start_stats["frames"]
        fsyncs = stats["fsyncs"] - self.start_stats["fsyncs"]
        return {
            "events": self.events,
            "seconds": self.seconds,
            "events_per_s": self.events / self.seconds,
            "p50_ms": _pct(self.latencies, 50) * 1000,
            "p99_ms": _pct(self.latencies, 99) * 1000,
            "fsyncs": fsyncs,
            "events_per_fsync": self.events / max(fsyncs, 1),
            "frame_bytes": (stats["bytes"] - self.start_stats["bytes"]) / max(frames, 1),
            "file_bytes": stats["bytes"],
        }


class _BareRun:
    """``threads`` threads, each ``os.write`` + ``os.fsync`` of one chunk, repeatedly,
    appending to one plain file (one chunk per fsync)."""

    def __init__(self, base: Path, threads: int = 1) -> None:
        self.threads = threads
        self.path = base / f"bare-{threads}.bin"
        self.latencies: list[float] = []
        self.seconds = 0.0
        self.writes = 0

    async def round(self, chunk: int, count: int) -> None:
        data = os.urandom(chunk)  # incompressible, like a zstd frame
        per = max(1, count // self.threads)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

        def work() -> None:
            for _ in range(per):
                t0 = time.perf_counter()
                os.write(fd, data)
                os.fsync(fd)
                self.latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.threads):
                    nursery.start_soon(functools.partial(trio.to_thread.run_sync, work))
        finally:
            os.close(fd)
        self.seconds += time.perf_counter() - t0
        self.writes += per * self.threads

    def result(self) -> dict:
        return {
            "writes": self.writes,
            "seconds": self.seconds,
            "per_s": self.writes / self.seconds,
            "p50_ms": _pct(self.latencies, 50) * 1000,
            "p99_ms": _pct(self.latencies, 99) * 1000,
            "file_bytes": self.path.stat().st_size,
        }


async def run(directory: Path | None, events: int, seed: int, rounds: int = 4) -> dict:
    """The four runs, interleaved in ``rounds`` (rotating order) so that a disk whose speed
    drifts during the run (other load, writeback) weighs on all of them alike."""
    base = Path(tempfile.mkdtemp(prefix="dsh-bench-", dir=directory))
    try:
        one, eight = _LogRun(base, "one", 1, seed), _LogRun(base, "eight", 8, seed)
        bare, bare8 = _BareRun(base, 1), _BareRun(base, 8)
        await one.open()
        await eight.open()
        # The bare chunk is the log's frame size: measured on a first, unrecorded probe.
        probe = _LogRun(base, "probe", 1, seed)
        await probe.open()
        await probe.round(50)
        chunk = max(1, round((await probe.close())["frame_bytes"]))
        per_round = max(8, events // rounds)
        steps = [
            lambda: one.round(per_round),
            lambda: eight.round(per_round),
            lambda: bare.round(chunk, per_round),
            lambda: bare8.round(chunk, per_round),
        ]
        for r in range(rounds):
            for k in range(len(steps)):
                await steps[(r + k) % len(steps)]()
        return {"dir": str(base), "fs": _fs_type(base.resolve()), "one": await one.close(),
                "eight": await eight.close(), "bare": bare.result(), "bare8": bare8.result(),
                "rounds": rounds}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def report(r: dict) -> str:
    one, eight, bare, bare8 = r["one"], r["eight"], r["bare"], r["bare8"]
    lines = [f"file system: {r['fs']}"]
    for name, b in (("1 thread ", bare), ("8 threads", bare8)):
        lines.append(
            f"bare os.write+os.fsync, {name} ({b['file_bytes'] // max(b['writes'], 1)} B chunks, "
            f"{b['writes']} writes): {b['per_s']:,.0f} durable writes/s, 1.00 events/fsync, "
            f"p50 {b['p50_ms']:.3f} ms, p99 {b['p99_ms']:.3f} ms")
    lines += [
        f"SessionLog, 1 flusher : {one['events_per_s']:,.0f} durable events/s, "
        f"flush p50 {one['p50_ms']:.3f} ms, p99 {one['p99_ms']:.3f} ms, "
        f"{one['events_per_fsync']:.2f} events/fsync, frame {one['frame_bytes']:.0f} B "
        f"-> {one['events_per_s'] / bare['per_s']:.2f}x bare with 1 thread",
        f"SessionLog, 8 flushers: {eight['events_per_s']:,.0f} durable events/s, "
        f"flush p50 {eight['p50_ms']:.3f} ms, p99 {eight['p99_ms']:.3f} ms, "
        f"{eight['events_per_fsync']:.2f} events/fsync (group commit) "
        f"-> {eight['events_per_s'] / bare8['per_s']:.2f}x bare with 8 threads",
    ]
    if r["fs"].startswith("tmpfs"):
        lines.append("note: tmpfs makes fsync free; run with --dir on a real disk")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=2000, help="durable events per run (default 2000)")
    p.add_argument("--dir", type=Path, default=None, help="directory on the file system to test "
                   "(default: the system temp dir)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    result = trio.run(run, args.dir, args.events, args.seed)
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
