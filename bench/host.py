"""Call-host benches (issue 12): throughput and CPU with the host in the path, RSS per idle
host, and the start-up cost of a call.

Theory of operation: every figure is printed next to a baseline measured in the same run. The
daemons are real ``dshd`` subprocesses (``bench.dshd_proc.BenchDaemon``) driven by the real
client library; the tools run ``danger-full-access`` so that the sandbox's own start-up does
not hide the host's.

* **throughput**: 1 GiB of ``seq`` and of ``base64`` through ``tool.run`` with 3 subscribed
  clients (mirrors applying every batch), from the request until every mirror shows the call
  settled, vs the shell pipeline ``CMD | tee SPILL | tail -c 51200 >/dev/null`` (the same work:
  a file of everything and a tail window). Rounds alternate; the best of each is kept. CPU:
  the daemon's from ``/proc/PID/stat`` before and after; the host's sampled from its
  ``/proc/PID/stat`` every 20 ms until it exits (its pid is in the call's ``host.json``), so it
  may miss up to 20 ms. Both as CPU-s per GiB. The call's log is unlinked after each run, like
  the baseline's file, so no run pays for an earlier one's writeback. Next to the host's CPU
  the bench prints what ``tee`` and ``tail`` cost in the baseline (its children's CPU from
  ``getrusage`` less that of ``CMD >/dev/null`` alone): the same job done by C programs.
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

from .dshd_proc import ROOT, BenchDaemon
from .streaming import _check_window, throughput_rig

GiB = 1 << 30
#: The last commit before the call host: ``start``'s default baseline.
PRE_HOST_REF = "7e9da8a"
COMMANDS = {
    "seq": "seq 1 999999999 | head -c {size}",
    "base64": "base64 -w 76 < /dev/urandom | head -c {size}",
}


def _cpu_of(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _call_dir(d: BenchDaemon, session_id: str, call_id: str) -> Path:
    return d.state_dir / "sessions" / session_id / "calls" / call_id


async def _sample_host_cpu(d: BenchDaemon, session_id: str, call_id: str, out: list) -> None:
    """Find the call's host by its host.json and sample its CPU until it is gone."""
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
        await trio.sleep(0.02)
    out.append(last)


async def bench_throughput(which: str, size: int, rounds: int) -> dict:
    cmd = COMMANDS[which].format(size=size)
    ours, base, dcpu, hcpu = [], [], [], []
    pipeline_cpu: list[float] = []
    producer_cpu: list[float] = []
    with BenchDaemon() as d:
        spill = d.dir / "baseline.spill"
        async with AsyncExitStack() as stack:
            driver, sid, watchers = await throughput_rig(d, "host-tp", stack)
            async with trio.open_nursery() as nursery:
                for w in watchers:
                    nursery.start_soon(w.run)
                for r in range(rounds):
                    for step in (("base", "ours") if r % 2 == 0 else ("ours", "base")):
                        if step == "base":
                            t0 = time.perf_counter()
                            c0 = _children_cpu()
                            await trio.run_process(
                                ["sh", "-c", f"{cmd} | tee {spill} | tail -c 51200 >/dev/null"],
                                check=True)
                            base.append(time.perf_counter() - t0)
                            pipeline_cpu.append(_children_cpu() - c0)
                            spill.unlink()
                            c0 = _children_cpu()
                            await trio.run_process(["sh", "-c", f"{cmd} >/dev/null"], check=True)
                            producer_cpu.append(_children_cpu() - c0)
                            continue
                        c0 = d.cpu_seconds()
                        host: list[float] = []
                        with trio.fail_after(600):
                            t0 = time.perf_counter()
                            cid = await driver.run_tool(sid, cmd)
                            async with trio.open_nursery() as inner:
                                inner.start_soon(_sample_host_cpu, d, sid, cid, host)
                                result = await driver.wait(sid, cid)
                                done = max([await w.wait_settled(cid) for w in watchers])
                        ours.append(done - t0)
                        dcpu.append(d.cpu_seconds() - c0)
                        hcpu.append(host[0])
                        if result["details"]["truncation"]["totalBytes"] != size:
                            raise AssertionError(f"dshd saw {result['details']['truncation']}")
                        _check_window(watchers, cid, result)
                        for part in _call_dir(d, sid, cid).glob("output.raw*"):
                            part.unlink()
                nursery.cancel_scope.cancel()
    gib = size / GiB
    return {"which": which, "size": size, "rounds": rounds, "base": base, "ours": ours,
            "ratio": min(ours) / min(base), "daemon_cpu_per_gib": min(dcpu) / gib,
            "host_cpu_per_gib": min(hcpu) / gib,
            # What tee and tail cost in the baseline: the pipeline's CPU less the producer's.
            "tee_cpu_per_gib": max(0.0, min(pipeline_cpu) - min(producer_cpu)) / gib}


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


def _spread(values: list[float]) -> str:
    return f"[{min(values):.3f} .. {max(values):.3f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.host", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--baseline-ref", default=PRE_HOST_REF,
                   help="git revision whose daemon and CLI are start's baseline")
    p.add_argument("--only", action="append", choices=["throughput", "idle", "start"])
    args = p.parse_args(argv)
    size, rounds = (64 << 20, 2) if args.quick else (GiB, 3)
    only = args.only or ["throughput", "idle", "start"]
    rows = []
    if "throughput" in only:
        for which in COMMANDS:
            r = trio.run(bench_throughput, which, size, rounds)
            print(f"throughput {which}: {size >> 20} MiB, 3 mirrors, best of {rounds}: baseline "
                  f"`CMD | tee SPILL | tail -c 51200` {min(r['base']):.2f} s {_spread(r['base'])}, "
                  f"dshd {min(r['ours']):.2f} s {_spread(r['ours'])}, ratio {r['ratio']:.2f}x; "
                  f"host {r['host_cpu_per_gib']:.2f} CPU-s/GiB (the baseline's tee + tail: "
                  f"{r['tee_cpu_per_gib']:.2f}), daemon "
                  f"{r['daemon_cpu_per_gib']:.2f} CPU-s/GiB", flush=True)
            rows += [(f"{which} wall ratio", f"{r['ratio']:.2f}x", "<= 1.2x", r["ratio"] <= 1.2),
                     (f"{which} host CPU-s/GiB", f"{r['host_cpu_per_gib']:.2f}", "<= 0.8",
                      r["host_cpu_per_gib"] <= 0.8),
                     (f"{which} daemon CPU-s/GiB", f"{r['daemon_cpu_per_gib']:.2f}", "<= 0.2",
                      r["daemon_cpu_per_gib"] <= 0.2)]
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
        print(f"  {name:<34} {value:>12}   goal {goal:<8} {'met' if met else 'NOT met'}")
    if args.quick:
        print("(--quick: sizes too small for the targets; a smoke run, not figures)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
