"""Call-host benches (issue 12): throughput and CPU with the host in the path, RSS per idle
host, and the start-up cost of a call.

Theory of operation: every figure is printed next to a baseline measured in the same run. The
daemons are real ``dshd`` subprocesses (``bench.dshd_proc.BenchDaemon``) driven by the real
client library; the tools run ``danger-full-access`` so that the sandbox's own start-up does
not hide the host's.

* **throughput**: 1 GiB of ``seq``, of ``base64`` and of a mixed realistic build log (compiler
  lines, GCC warnings with UTF-8 quotes and ANSI colour, ``\\r`` progress meters, test results;
  :func:`build_log` makes 48 MiB of it once, ``cat`` repeats it) through ``tool.run`` with 3
  subscribed clients (mirrors applying every batch), from the request until every mirror shows
  the call settled, vs the shell pipeline ``CMD | tee SPILL | tail -c 51200 >/dev/null`` (the
  same work: a file of everything and a tail window). Rounds are interleaved (each round runs
  every source; within a round the baseline and ours alternate which goes first); every figure
  is the median with its min..max over the rounds, never a best-of. CPU: the daemon's from
  ``/proc/PID/stat`` before and after; the host's sampled from its ``/proc/PID/stat`` every
  5 ms until it exits (its pid is in the call's ``host.json``), so it may miss a few ms. Both
  as CPU-s per GiB, separately and together (the issue's goal is on the sum). The call's log
  is unlinked after each run, like the baseline's file, so no run pays for an earlier one's
  writeback. Next to them the bench prints what ``tee`` and ``tail`` cost in the baseline (its
  children's CPU from ``getrusage`` less that of ``CMD >/dev/null`` alone): the same job done
  by C programs.
* **idle**: N sessions each run ``sleep 60``; once every call is running, the hosts' ``VmRSS``
  and ``Pss`` (``/proc/PID/smaps_rollup``), per host. Baseline: the same figures of a bare
  ``python3 -I -S -c 'import time; time.sleep(60)'`` (CPython's floor).
* **start**: ``dsh run -- true`` end to end (a new CLI process each time), median and spread
  over rounds, against a daemon and CLI of the tree given by ``--baseline-ref`` (default: the
  last commit before the call host), checked out in a temporary worktree, in the same run.

``--quick`` shrinks sizes and counts for a smoke run. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from client.api import connect

from .dshd_proc import ROOT, BenchDaemon, top_frames
from .streaming import _check_window, throughput_rig

GiB = 1 << 30
#: The last commit before the call host: ``start``'s default baseline.
PRE_HOST_REF = "7e9da8a"
#: Size of the generated build log that the ``buildlog`` source repeats (bytes).
BUILDLOG_BYTES = 48 << 20
COMMANDS = {
    "seq": "seq 1 999999999 | head -c {size}",
    "base64": "base64 -w 76 < /dev/urandom | head -c {size}",
    "buildlog": "while cat {buildlog}; do :; done | head -c {size}",
}
#: Goals of issue 14 (CPU-s per GiB; wall ratio against the shell pipeline).
GOAL_RATIO, GOAL_CPU, GOAL_DAEMON_CPU = 1.2, 1.0, 0.2
#: The host's profiling hook (dshd.callhost.host.PROFILE_ENV).
HOST_PROFILE_ENV = "DSH_HOST_PROFILE"


def build_log(size: int, seed: int = 14) -> bytes:
    """``size`` bytes of a mixed, realistic build log: compiler command lines, GCC warnings
    with UTF-8 quotes and ANSI colour, source excerpts with carets, `\\r` progress lines (a
    download meter and a ninja-style status line), test results with UTF-8 marks."""
    rng = random.Random(seed)
    dirs = ["src/core", "src/net", "src/storage", "lib/util", "src/ui/widgets", "third_party/zstd"]
    stems = ["buffer", "parser", "session", "socket", "writer", "reader", "index", "cache",
             "config", "token", "stream", "frame", "pool", "queue", "codec", "hash", "résumé"]
    out: list[str] = []
    n = step = 0
    while n < size:
        step += 1
        d, s = rng.choice(dirs), rng.choice(stems)
        r = rng.random()
        if r < 0.40:
            line = (f"\x1b[32m[{step % 4000:4d}/4000]\x1b[0m Building CXX object "
                    f"{d}/CMakeFiles/{s}.dir/{s}_{step}.cc.o\n")
        elif r < 0.58:
            line = (f"g++ -O2 -g -Wall -Wextra -I{d} -Iinclude -c {d}/{s}_{step}.cc "
                    f"-o build/{d}/{s}_{step}.o\n")
        elif r < 0.70:
            col = rng.randint(1, 60)
            var = f"{s[:3]}{rng.randint(0, 99)}"
            line = (f"\x1b[01m{d}/{s}_{step}.cc:{rng.randint(1, 2000)}:{col}:\x1b[m "
                    f"\x1b[01;35mwarning: \x1b[munused variable ‘\x1b[01m{var}\x1b[m’ "
                    f"[\x1b[01;35m-Wunused-variable\x1b[m]\n"
                    f" {rng.randint(1, 2000):4d} |   int {var} = {rng.randint(0, 9999)};\n"
                    f"      | {' ' * col}\x1b[01;35m^~~~\x1b[m\n")
        elif r < 0.82:
            total = rng.randint(2, 90)
            line = "".join(f"\rDownloading {s}-{step}.tar.gz  {i * 100 // 8:3d}% "
                           f"{total * i / 8:5.1f} MB / {total} MB" for i in range(9)) + "\n"
        elif r < 0.92:
            mark = "✓ PASSED" if rng.random() < 0.9 else "✗ FAILED"
            line = f"tests/{s}/test_{step % 311}.py::test_{s}_{step} {mark} ({rng.random():.2f}s)\n"
        else:
            line = f"\r\x1b[K[{step % 4000:4d}/4000] Linking CXX static library lib{s}_{step % 97}.a"
        out.append(line)
        n += len(line.encode())
    return "".join(out).encode()[:size]


def _cpu_of(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _call_dir(d: BenchDaemon, session_id: str, call_id: str) -> Path:
    return d.state_dir / "sessions" / session_id / "calls" / call_id


async def _sample_host_cpu(d: BenchDaemon, session_id: str, call_id: str, out: list) -> None:
    """Find the call's host by its host.json and sample its CPU until it is gone (every 5 ms:
    it may miss the last few ms, which the host spends after its exit record)."""
    host_json = _call_dir(d, session_id, call_id) / "host.json"
    while True:
        try:
            pid = json.loads(host_json.read_text())["pid"]
            break
        except (OSError, ValueError, KeyError):
            await trio.sleep(0.005)
    last = 0.0
    while (cpu := _cpu_of(pid)) is not None:
        last = cpu
        await trio.sleep(0.005)
    out.append(last)


async def _baseline_round(cmd: str, spill: Path, fig: dict) -> None:
    """``CMD | tee SPILL | tail -c 51200``: wall, and the CPU of tee + tail (the pipeline's
    children CPU less that of ``CMD >/dev/null`` alone, run right after)."""
    t0 = time.perf_counter()
    c0 = _children_cpu()
    await trio.run_process(["sh", "-c", f"{cmd} | tee {spill} | tail -c 51200 >/dev/null"],
                           check=True)
    fig["base"].append(time.perf_counter() - t0)
    pipeline = _children_cpu() - c0
    spill.unlink()
    c0 = _children_cpu()
    await trio.run_process(["sh", "-c", f"{cmd} >/dev/null"], check=True)
    fig["tee"].append(max(0.0, pipeline - (_children_cpu() - c0)))


async def _our_round(d: BenchDaemon, driver, sid: str, watchers, cmd: str, size: int,
                     fig: dict) -> None:
    """One ``tool.run`` of ``cmd`` until every mirror shows it settled: wall, daemon CPU, host
    CPU; the totals and every mirror's window are checked."""
    c0 = d.cpu_seconds()
    host: list[float] = []
    with trio.fail_after(600):
        t0 = time.perf_counter()
        cid = await driver.run_tool(sid, cmd)
        async with trio.open_nursery() as inner:
            inner.start_soon(_sample_host_cpu, d, sid, cid, host)
            result = await driver.wait(sid, cid)
            done = max([await w.wait_settled(cid) for w in watchers])
    fig["ours"].append(done - t0)
    fig["daemon"].append(d.cpu_seconds() - c0)
    fig["host"].append(host[0])
    if result["details"]["truncation"]["totalBytes"] != size:
        raise AssertionError(f"dshd saw {result['details']['truncation']}")
    _check_window(watchers, cid, result)
    for part in _call_dir(d, sid, cid).glob("output.raw*"):
        part.unlink()  # so that no later run pays for this one's writeback


async def bench_throughput(sources: list[str], size: int, rounds: int,
                           profile: Path | None = None) -> dict:
    """Every source, ``rounds`` interleaved rounds (sources in turn; within a round the
    baseline and ours alternate which goes first), one daemon with 3 mirrors. ``profile``: a
    directory; the daemon runs under py-spy (``daemon.raw``) and every host under cProfile
    (``host-PID.prof``): the figures then include the profilers' overhead."""
    figs = {w: {k: [] for k in ("base", "ours", "daemon", "host", "tee")} for w in sources}
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        os.environ[HOST_PROFILE_ENV] = str(profile)  # the daemon passes it to its hosts
    with BenchDaemon(profile=None if profile is None else profile / "daemon.raw") as d:
        spill = d.dir / "baseline.spill"
        buildlog = d.dir / "buildlog.txt"
        buildlog.write_bytes(build_log(BUILDLOG_BYTES))
        async with AsyncExitStack() as stack:
            driver, sid, watchers = await throughput_rig(d, "host-tp", stack)
            async with trio.open_nursery() as nursery:
                for w in watchers:
                    nursery.start_soon(w.run)
                for r in range(rounds):
                    for which in sources:
                        cmd = COMMANDS[which].format(size=size, buildlog=buildlog)
                        fig = figs[which]
                        for step in (("base", "ours") if r % 2 == 0 else ("ours", "base")):
                            if step == "base":
                                await _baseline_round(cmd, spill, fig)
                            else:
                                await _our_round(d, driver, sid, watchers, cmd, size, fig)
                nursery.cancel_scope.cancel()
    gib = size / GiB
    out = {}
    for which, f in figs.items():
        per_gib = {k: [v / gib for v in f[k]] for k in ("daemon", "host", "tee")}
        per_gib["total"] = [a + b for a, b in zip(per_gib["daemon"], per_gib["host"])]
        out[which] = {"base": f["base"], "ours": f["ours"],
                      "ratios": [o / b for o, b in zip(f["ours"], f["base"])],
                      "ratio": statistics.median(f["ours"]) / statistics.median(f["base"]),
                      **per_gib}
    return out


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _rss_pss_kib(pid: int) -> tuple[int, int]:
    rss = pss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            pss = int(line.split()[1])
    return rss, pss


async def bench_idle(n: int) -> dict:
    floor = subprocess.Popen(["python3", "-I", "-S", "-c", "import time; time.sleep(60)"])
    try:
        await trio.sleep(0.5)
        floor_rss, floor_pss = _rss_pss_kib(floor.pid)
    finally:
        floor.kill()
        floor.wait()
    with BenchDaemon() as d:
        async with connect(d.socket, "bench-idle") as client:
            calls = []
            for i in range(n):
                sid = await client.create_session(str(d.work), f"idle-{i}", sandbox="danger-full-access")
                calls.append((sid, await client.run_tool(sid, "sleep 60")))
            pids = []
            with trio.fail_after(60):
                for sid, cid in calls:
                    host_json = _call_dir(d, sid, cid) / "host.json"
                    while not host_json.exists():
                        await trio.sleep(0.02)
                    pids.append(json.loads(host_json.read_text())["pid"])
            await trio.sleep(1.0)  # let every host settle into its idle loop
            figures = [_rss_pss_kib(pid) for pid in pids]
            for sid, cid in calls:
                await client.cancel(sid, cid)
    rss = [f[0] for f in figures]
    pss = [f[1] for f in figures]
    return {"n": n, "rss_kib": statistics.mean(rss), "pss_kib": statistics.mean(pss),
            "rss_range": (min(rss), max(rss)), "floor_rss_kib": floor_rss,
            "floor_pss_kib": floor_pss}


def _dsh_true(d: BenchDaemon, root: Path, rounds: int) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(root), DSH_SOCKET=str(d.socket))
    argv = [sys.executable, "-c", "import sys; from client.cli import main; sys.exit(main())",
            "run", "--", "true"]
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, cwd=str(d.work), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def bench_start(ref: str, rounds: int) -> dict:
    tree = Path(tempfile.mkdtemp(prefix="dsb-base-", dir="/tmp"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), ref],
                   check=True)
    try:
        results = {}
        for label, root in (("base", tree), ("ours", ROOT)):
            with BenchDaemon(root=root) as d:
                _dsh_true(d, root, 2)  # warm the page cache and the daemon
                results[label] = _dsh_true(d, root, rounds)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=False)
    b, o = statistics.median(results["base"]), statistics.median(results["ours"])
    return {"ref": ref, "rounds": rounds, "base": results["base"], "ours": results["ours"],
            "base_median": b, "ours_median": o, "overhead_ms": (o - b) * 1000}


def print_profile(where: Path, n: int = 14) -> None:
    """The daemon's heaviest leaf frames (py-spy) and the hosts' heaviest functions by own
    time (cProfile, all hosts of the run merged)."""
    print("profile, daemon (py-spy, share of busy samples, own time):")
    for share, frame in top_frames(where / "daemon.raw", n):
        print(f"  {share:6.1%}  {frame}")
    hosts = sorted(where.glob("host-*.prof"))
    if not hosts:
        print("profile, hosts: none written (is the host's environment the daemon's?)")
        return
    stats = pstats.Stats(*map(str, hosts))
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    total = sum(v[2] for v in stats.stats.values()) or 1.0
    print(f"profile, {len(hosts)} host(s) (cProfile, own time, {total:.2f} s in all):")
    for (file, line, func), (_cc, calls, own, _cum, _callers) in rows:
        print(f"  {own / total:6.1%}  {own:7.3f} s  {calls:8d} calls  {func} "
              f"({os.path.basename(file)}:{line})")


def _spread(values: list[float]) -> str:
    return f"[{min(values):.3f} .. {max(values):.3f}]"


def _med(values: list[float], unit: str = "") -> str:
    """Median and min..max (the spread over rounds)."""
    return f"{statistics.median(values):.2f}{unit} [{min(values):.2f}..{max(values):.2f}]"


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def _print_throughput(results: dict, size: int, rounds: int) -> list:
    rows = []
    for which, r in results.items():
        ratio = r["ratio"]
        total = statistics.median(r["total"])
        daemon = statistics.median(r["daemon"])
        print(f"throughput {which}: {size >> 20} MiB, 3 mirrors, median [min..max] of {rounds} "
              f"interleaved rounds:\n"
              f"  wall: baseline `CMD | tee SPILL | tail -c 51200` {_med(r['base'], ' s')}, "
              f"dshd {_med(r['ours'], ' s')}; ratio of medians {ratio:.2f}x (per round "
              f"{_spread(r['ratios'])}), goal <= {GOAL_RATIO}x: {_verdict(ratio <= GOAL_RATIO)}\n"
              f"  CPU-s/GiB: host {_med(r['host'])}, daemon {_med(r['daemon'])}, together "
              f"{_med(r['total'])}; goal together <= {GOAL_CPU}: {_verdict(total <= GOAL_CPU)}, "
              f"daemon <= {GOAL_DAEMON_CPU}: {_verdict(daemon <= GOAL_DAEMON_CPU)}; the "
              f"baseline's tee + tail: {_med(r['tee'])}", flush=True)
        rows += [(f"{which} wall ratio", f"{ratio:.2f}x", f"<= {GOAL_RATIO}x", ratio <= GOAL_RATIO),
                 (f"{which} daemon+host CPU-s/GiB", f"{total:.2f}", f"<= {GOAL_CPU}",
                  total <= GOAL_CPU),
                 (f"{which} daemon CPU-s/GiB", f"{daemon:.2f}", f"<= {GOAL_DAEMON_CPU}",
                  daemon <= GOAL_DAEMON_CPU)]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.host", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--baseline-ref", default=PRE_HOST_REF,
                   help="git revision whose daemon and CLI are start's baseline")
    p.add_argument("--only", action="append", choices=["throughput", "idle", "start"])
    p.add_argument("--source", action="append", choices=list(COMMANDS),
                   help="throughput sources (default: all)")
    p.add_argument("--size-mib", type=int, help="bytes per throughput run (default 1024)")
    p.add_argument("--rounds", type=int, help="throughput rounds (default 3, at least 1)")
    p.add_argument("--profile", type=Path, help="a directory: throughput with the daemon under "
                   "py-spy and the hosts under cProfile; prints the heaviest frames")
    args = p.parse_args(argv)
    size, rounds = (32 << 20, 1) if args.quick else (GiB, 3)
    if args.size_mib is not None:
        size = max(1, args.size_mib) << 20
    if args.rounds is not None:
        rounds = max(1, args.rounds)
    only = args.only or ["throughput", "idle", "start"]
    rows = []
    if "throughput" in only:
        results = trio.run(bench_throughput, args.source or list(COMMANDS), size, rounds,
                           args.profile)
        rows += _print_throughput(results, size, rounds)
        if args.profile is not None:
            print_profile(args.profile)
    if "idle" in only:
        r = trio.run(bench_idle, 3 if args.quick else 10)
        print(f"idle: {r['n']} hosts running `sleep 60`: VmRSS {r['rss_kib'] / 1024:.1f} MiB per "
              f"host (range {r['rss_range'][0] / 1024:.1f}..{r['rss_range'][1] / 1024:.1f}), Pss "
              f"{r['pss_kib'] / 1024:.1f} MiB; floor `python3 -I -S` sleeping: VmRSS "
              f"{r['floor_rss_kib'] / 1024:.1f} MiB, Pss {r['floor_pss_kib'] / 1024:.1f} MiB",
              flush=True)
        rows.append(("host RSS per idle call", f"{r['rss_kib'] / 1024:.1f} MiB", "~11 MiB",
                     r["rss_kib"] <= 16 * 1024))
    if "start" in only:
        r = bench_start(args.baseline_ref, 5 if args.quick else 15)
        print(f"start: `dsh run -- true` end to end, median of {r['rounds']}: {args.baseline_ref} "
              f"{r['base_median'] * 1000:.0f} ms {_spread(r['base'])}, now "
              f"{r['ours_median'] * 1000:.0f} ms {_spread(r['ours'])}: "
              f"{r['overhead_ms']:+.0f} ms per call", flush=True)
        rows.append(("start overhead (dsh run -- true)", f"{r['overhead_ms']:+.0f} ms", "~30 ms",
                     r["overhead_ms"] <= 60))
    print()
    for name, value, goal, met in rows:
        print(f"  {name:<34} {value:>12}   goal {goal:<8} {_verdict(met)}")
    if args.quick:
        print("(--quick: sizes too small for the targets; a smoke run, not figures)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
