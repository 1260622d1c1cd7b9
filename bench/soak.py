"""Churn soak: the daemon's RSS while clients connect, subscribe, call and vanish (issue 14).

Theory of operation: one real ``dshd`` (``bench.dshd_proc.BenchDaemon``), real clients
(``client.api.connect`` over the real socket), real call hosts. ``--workers`` tasks loop
until ``--seconds`` have passed; each round one worker connects, picks one of the
``--sessions`` sessions (``session_idle_seconds`` is short, so idle sessions close and are
reopened from their logs), subscribes and reads a batch or
two, runs ``--calls`` short calls (``true`` / ``echo``) and waits for each, now and then
asks ``tool.wait`` of an old call and a ``session.events`` page from the start (the paths
that read old frames from disk), sometimes starts a call it never waits for, and then drops
the connection without unsubscribing (an abrupt disconnect). The daemon's RSS
(``/proc/PID/status`` ``VmRSS``) is sampled every ``--sample`` seconds.

Printed: the baseline (RSS of the idle daemon just started, in the same run), the RSS at the
end of the warm-up (the first ``--warmup`` share of the run, at least 30 s), min/max after
it, the drift (last sample vs warm-up) and the largest deviation from the warm-up, and the
goal of the issue: flat within +-20 % after warm-up, "met" / "NOT met". Also the work done
(rounds, calls, sessions, disconnects, errors): a soak that did nothing measures nothing.
The ``--sessions`` pool is made before the clock starts: each open session has a fixed cost
(its writer, compressor, lane), which a pool growing through the run would show as a leak.
Never asserts on time.

``python -m bench.soak`` runs the real figure (``--seconds 900``, the issue's 15 minutes);
``make bench`` (``python -m bench``, which calls ``main([])``) runs a shorter soak of
:data:`MAKE_BENCH_SECONDS` and says so in its output.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import trio

from client.api import connect

from .dshd_proc import ROOT, BenchDaemon

#: The soak ``make bench`` runs (``main([])``), seconds; ``--seconds`` sets another.
MAKE_BENCH_SECONDS = 150.0
#: The real figure's length (``python -m bench.soak``): the issue's 15 minutes.
REAL_SECONDS = 900.0
GOAL_PERCENT = 20.0


class Work:
    """What the workers did (counted: the printout shows the soak did real work)."""

    def __init__(self) -> None:
        self.rounds = self.calls = self.old_waits = self.pages = self.unwaited = 0
        self.errors = 0
        self.sessions: list[str] = []
        self.calls_of: dict[str, list[str]] = {}
        self.last_error = ""


async def _round(d: BenchDaemon, args, work: Work, rng: random.Random) -> None:
    with trio.move_on_after(30):  # a round that hangs is dropped (counted below)
        async with connect(d.socket, "bench-soak") as client:
            sid = rng.choice(work.sessions)
            sub = await client.subscribe(sid)
            with trio.move_on_after(1):
                async for _view in sub:
                    break  # the base batch
            for i in range(args.calls):
                command = "true" if i % 2 else f"echo soak {work.calls}"
                cid = await client.run_tool(sid, command)
                await client.wait(sid, cid)
                work.calls_of[sid].append(cid)
                work.calls += 1
            old = work.calls_of[sid]
            if len(old) > 10 and rng.random() < 0.3:
                await client.wait(sid, old[rng.randrange(len(old) // 2)], timeout=5)
                work.old_waits += 1
            if rng.random() < 0.2:
                await client.events(sid, -1, 200)
                work.pages += 1
            if rng.random() < 0.2:
                await client.run_tool(sid, "sleep 0.2")  # never waited for: we vanish
                work.unwaited += 1
            work.rounds += 1
            # leaving the block drops the connection: no unsubscribe (abrupt)
        return
    work.errors += 1
    work.last_error = "a round took more than 30 s"


async def _worker(d: BenchDaemon, args, work: Work, seed: int, until: float) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        try:
            await _round(d, args, work, rng)
        except Exception as exc:  # counted and shown: a soak of errors is no soak
            work.errors += 1
            work.last_error = f"{type(exc).__name__}: {exc}"
            await trio.sleep(0.2)


async def _sessions(d: BenchDaemon, args, work: Work) -> None:
    """The session pool, made before the clock starts (a session's first open is part of
    its steady cost, not a leak); idle ones close and reopen during the soak."""
    async with connect(d.socket, "bench-soak") as client:
        for _ in range(args.sessions):
            sid = await client.create_session(str(d.work), "soak", sandbox="danger-full-access",
                                              approval_policy="never")
            work.sessions.append(sid)
            work.calls_of[sid] = []


async def _soak(d: BenchDaemon, args) -> tuple[list[tuple[float, int]], Work]:
    work = Work()
    await _sessions(d, args, work)
    samples: list[tuple[float, int]] = []
    start = time.monotonic()
    until = start + args.seconds
    async with trio.open_nursery() as nursery:
        for i in range(args.workers):
            nursery.start_soon(_worker, d, args, work, args.seed + i, until)
        while time.monotonic() < until:
            samples.append((time.monotonic() - start, d.rss_kib()))
            await trio.sleep(min(args.sample, max(0.0, until - time.monotonic())))
        samples.append((time.monotonic() - start, d.rss_kib()))
    return samples, work


def report(samples: list[tuple[float, int]], baseline_kib: int, warmup: float) -> dict:
    """The figures of the printout (module doc); pure, for a test of the arithmetic. A run
    shorter than :data:`REAL_SECONDS` also projects the trend after warm-up (a least-squares
    line) to the real length: a slow leak passes a short soak, not its projection."""
    after = [(t, rss) for t, rss in samples if t >= warmup] or [samples[-1]]
    warm = [rss for _, rss in after]
    at_warmup = warm[0]
    dev = max(abs(r - at_warmup) for r in warm) * 100.0 / at_warmup
    slope = 0.0  # KiB per second
    if len(after) >= 3 and after[-1][0] > after[0][0]:
        slope = statistics.linear_regression([t for t, _ in after], warm).slope
    span = after[-1][0] - after[0][0]
    projected = slope * max(REAL_SECONDS - warmup, span) * 100.0 / at_warmup
    return {"baseline_kib": baseline_kib, "warmup_kib": at_warmup, "min_kib": min(warm),
            "max_kib": max(warm), "last_kib": warm[-1],
            "drift_percent": (warm[-1] - at_warmup) * 100.0 / at_warmup,
            "max_deviation_percent": dev, "slope_mib_per_min": slope * 60 / 1024,
            "projected_percent": projected,
            "met": dev <= GOAL_PERCENT and abs(projected) <= GOAL_PERCENT,
            "samples": len(warm)}


def _parser(default_seconds: float) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=default_seconds)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--calls", type=int, default=3, help="waited calls per round")
    p.add_argument("--sessions", type=int, default=40, help="sessions made before the soak")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    p.add_argument("--warmup", type=float, default=0.2, help="share of the run (>= 30 s)")
    p.add_argument("--idle-seconds", type=float, default=20.0,
                   help="the daemon's session_idle_seconds (idle sessions close, reopen)")
    p.add_argument("--snapshot-every", type=int, default=None,
                   help="the daemon's snapshot_every_events (default: the daemon's default)")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the source tree whose dshd runs (a baseline checkout, say)")
    return p


def main(argv: list[str], *, default_seconds: float = MAKE_BENCH_SECONDS) -> int:
    args = _parser(default_seconds).parse_args(argv)
    warmup = min(max(30.0, args.warmup * args.seconds), args.seconds / 2)
    how = ("the real figure" if args.seconds >= REAL_SECONDS else
           f"a SHORT soak ({'make bench default' if not argv else '--seconds'}); the "
           f"issue's figure is `python -m bench.soak` ({REAL_SECONDS:.0f} s)")
    print(f"soak: {args.seconds:.0f} s churn ({how}), {args.workers} workers, RSS every "
          f"{args.sample:g} s, warm-up {warmup:.0f} s")
    if args.root != ROOT:
        print(f"  daemon from the tree {args.root}")
    config: dict = {"session_idle_seconds": args.idle_seconds}
    if args.snapshot_every is not None:
        config["snapshot_every_events"] = args.snapshot_every
        print(f"  snapshot_every_events = {args.snapshot_every}")
    with BenchDaemon(config, root=args.root) as d:
        time.sleep(1.0)
        baseline = d.rss_kib()
        samples, work = trio.run(_soak, d, args)
    r = report(samples, baseline, warmup)
    print(f"  work: {work.rounds} rounds, {work.calls} waited calls, {work.unwaited} unwaited, "
          f"{work.old_waits} waits on old calls, {work.pages} event pages from seq 0, "
          f"{len(work.sessions)} sessions, {work.rounds} abrupt disconnects, "
          f"{work.errors} errors{' (last: ' + work.last_error + ')' if work.errors else ''}")
    print(f"  baseline (idle daemon, same run): {r['baseline_kib'] / 1024:.1f} MiB")
    print(f"  RSS at end of warm-up: {r['warmup_kib'] / 1024:.1f} MiB; after it min "
          f"{r['min_kib'] / 1024:.1f} / max {r['max_kib'] / 1024:.1f} / last "
          f"{r['last_kib'] / 1024:.1f} MiB over {r['samples']} samples")
    print(f"  drift {r['drift_percent']:+.1f} %, largest deviation "
          f"{r['max_deviation_percent']:.1f} %, trend {r['slope_mib_per_min']:+.2f} MiB/min = "
          f"{r['projected_percent']:+.1f} % over a {REAL_SECONDS:.0f} s soak")
    print(f"  goal: flat within +-{GOAL_PERCENT:.0f} % after warm-up (measured and trend): "
          f"{'met' if r['met'] else 'NOT met'}")
    print("  samples (s, MiB): " + " ".join(f"{t:.0f}:{rss / 1024:.1f}" for t, rss in samples))
    if work.rounds == 0:
        print("  NO round completed: the figure above measures nothing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], default_seconds=REAL_SECONDS))
