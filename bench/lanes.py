"""Lane benches (issue 14): write → mirror latency of many concurrent calls, and how soon a
settled call leaves the lane after ``tool.wait`` answers, even right after a big batch.

Theory of operation: one real ``dshd`` (``bench.dshd_proc.BenchDaemon``), the real client
library over the real socket, real call hosts. Nothing asserts on time; every figure is printed
next to a baseline measured in the same run, as the median and min–max over ≥ 3 interleaved
rounds (never a best-of), with the issue's goal and "met"/"NOT met".

* **latency** (goal: 100 calls, p50 ≤ 10 ms, p99 ≤ 50 ms; also 1, 10, 50 calls): N calls in
  one session, each a small Python program printing ``time.time_ns()`` lines on an absolute
  100 lines/s schedule (the calls' phases spread evenly over the 10 ms period), for
  ``--seconds``. One subscribed client (``client.api``, its ``Subscription`` applying every
  batch to its mirror) takes ``now - stamp`` for every line when it first shows in the mirror
  (new lines of a call are the last ``totalLines`` growth of its window). Lines stamped before
  every call had started (plus a short settling time) are left out: the figures are of the
  steady state. Baseline: the same N programs read straight from pipes by this process (the
  floor: pipe + wake-up on the same loaded machine). The CPU shares of the daemon, of the
  session's call hosts (pids from their ``host.json``) and of the mirror client over the
  steady window are printed beside it (``/proc/PID/stat``): at 50-100 calls the hosts take
  the machine's cores. ``--root`` runs another source tree's daemon (an export of main, say)
  for a before/after comparison.
* **leave** (goal ≤ 50 ms): a call settles and the time from ``tool.wait``'s answer to the
  mirror showing it in ``recent`` (negative: the mirror saw it first) is taken in four
  situations: an idle lane (the baseline); right after a ~1 MiB batch (21 calls burst 50 KB of
  base64 each at one instant T, the probe call exits 0.2 s after T, inside that batch's byte
  pause; the bench fails when less than 256 KiB of windows (5 windows in --quick) had reached
  the mirror by then); a call with a 1 MiB argument; and a call whose own output is a 1 MiB
  burst.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

from client.api import Client, connect

from .dshd_proc import ROOT, BenchDaemon, top_frames

MiB = 1024 * 1024
#: The interpreter the benches' tool programs run with: this one's real binary, no site (a
#: ``python3`` on PATH may be a version manager's shell shim costing ~100 ms per start).
PY = f"{os.path.realpath(sys.executable)} -I -S"
#: The goals of the issue's table.
GOAL_P50_MS, GOAL_P99_MS, GOAL_LEAVE_MS = 10.0, 50.0, 50.0

#: Prints ``time.time_ns()`` lines at 100/s from the epoch time argv[1] for argv[2] lines.
STAMP_PROG = (
    "import time,sys\n"
    "t0=float(sys.argv[1]); n=int(sys.argv[2]); w=sys.stdout.write; f=sys.stdout.flush\n"
    "for i in range(n):\n"
    "    d=t0+i*0.01-time.time()\n"
    "    d>0 and time.sleep(d)\n"
    "    w(str(time.time_ns())+chr(10)); f()\n"
)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _spread(values: list[float], digits: int = 2) -> str:
    return (f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-"
            f"{max(values):.{digits}f})")


def host_cpu_seconds(d: BenchDaemon, session_id: str) -> dict[int, float]:
    """User + system CPU so far of each live call host of the session, by pid (from host.json;
    a pid counts only while its command line is a call host: pids of ended hosts are reused)."""
    out: dict[int, float] = {}
    for record in d.state_dir.glob(f"sessions/{session_id}/calls/*/host.json"):
        try:
            pid = json.loads(record.read_text())["pid"]
            if b"callhost/main.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError, KeyError):
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _last_lines(text: str, n: int) -> list[str]:
    """The last ``n`` complete lines of ``text`` (fewer when it holds fewer); only the tail
    is split, so a mirror of 100 windows is read in time."""
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    parts = text.rsplit("\n", n + 1)
    return parts[:-1] if len(parts) <= n + 1 else parts[1:-1]


def _stamp_cmd(t0: float, lines: int) -> str:
    return f"{PY} -c '{STAMP_PROG}' {t0:.6f} {lines}"


# ------------------------------------------------------------------------------ latency
async def _pipe_baseline(n: int, seconds: float, start_margin: float) -> list[float]:
    """The same N stamp programs read from pipes by this process (the floor)."""
    t0 = time.time() + start_margin
    lines = int((start_margin + seconds) / 0.01)
    lat: list[float] = []
    ready_ns = int((t0 + 0.3) * 1e9)

    async def one(k: int) -> None:
        cmd = _stamp_cmd(t0 + k * 0.01 / n, lines)
        proc = await trio.lowlevel.open_process(["sh", "-c", cmd], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        buf = b""
        try:
            while data := await proc.stdout.receive_some(65536):
                now = time.time_ns()
                buf += data
                *done, buf = buf.split(b"\n")
                lat.extend((now - int(x)) / 1e6 for x in done if x and int(x) >= ready_ns)
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    with trio.fail_after(start_margin + seconds + 60):
        async with trio.open_nursery() as nursery:
            for k in range(n):
                nursery.start_soon(one, k)
    return lat


async def _lane_latency(d: BenchDaemon, driver: Client, watcher: Client, n: int,
                        seconds: float, start_margin: float) -> dict:
    """One round: N stamp calls in a fresh session, one mirror; latencies in ms."""
    sid = await driver.create_session(str(d.work), f"lanes-{n}", sandbox="danger-full-access")
    sub = await watcher.subscribe(sid)
    await sub.next_view()
    t0 = time.time() + start_margin
    lines = int((start_margin + seconds) / 0.01)
    seen: dict[str, int] = {}
    lat: list[float] = []
    missed = 0
    batches = 0
    ready_ns: list[int] = [1 << 62]  # lines stamped before every call ran are not counted
    ids: list[str] = []
    results: list = []

    async def drive(cancel: trio.CancelScope) -> None:
        async with trio.open_nursery() as nursery:
            for k in range(n):
                async def start(k: int = k) -> None:
                    ids.append(await driver.run_tool(sid, _stamp_cmd(t0 + k * 0.01 / n, lines)))
                nursery.start_soon(start)
        ready_ns[0] = max(time.time_ns(), int(t0 * 1e9)) + 300_000_000
        for cid in ids:
            results.append(await driver.wait(sid, cid))
        await trio.sleep(0.3)  # the last batches reach the mirror
        cancel.cancel()

    cpu: dict[str, float] = {}

    async def sample_cpu() -> None:
        """CPU shares (of a core) of the daemon, the call hosts and this mirror client over
        the steady window: from ``ready`` to just before the last lines."""
        while ready_ns[0] == 1 << 62:
            await trio.sleep(0.05)
        await trio.sleep(max(0.0, ready_ns[0] / 1e9 - time.time()))
        a = (d.cpu_seconds(), host_cpu_seconds(d, sid), time.process_time(), time.perf_counter())
        await trio.sleep(max(0.5, t0 + lines * 0.01 - time.time() - 0.3))
        b = (d.cpu_seconds(), host_cpu_seconds(d, sid), time.process_time(), time.perf_counter())
        wall = b[3] - a[3]
        hosts = sum(b[1][pid] - a[1][pid] for pid in a[1].keys() & b[1].keys())
        cpu.update(daemon=(b[0] - a[0]) / wall, hosts=hosts / wall, hosts_seen=len(a[1]),
                   client=(b[2] - a[2]) / wall)

    with trio.fail_after(start_margin + seconds + 120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drive, nursery.cancel_scope)
            nursery.start_soon(sample_cpu)
            async for view in sub:
                now = time.time_ns()
                batches += 1
                for cid, tool in view["tools"].items():
                    out = tool["output"]
                    total = out["truncation"]["totalLines"]
                    new = total - seen.get(cid, 0)
                    if new <= 0:
                        continue
                    seen[cid] = total
                    text = out["content"][0]["text"]
                    got = _last_lines(text, new)
                    missed += new - len(got)
                    for x in got:
                        stamp = int(x)
                        if stamp >= ready_ns[0]:
                            lat.append((now - stamp) / 1e6)
    for result in results:
        if result["isError"]:
            raise AssertionError(f"a stamp call failed: {result['content']}")
    await sub.aclose()
    if not lat:
        raise AssertionError("no line reached the mirror in the steady window")
    return {"lat": lat, "missed": missed, "batches": batches, "cpu": cpu}


async def bench_latency(counts: list[int], rounds: int, seconds: float,
                        config: dict | None = None, profile: Path | None = None,
                        root: Path = ROOT) -> dict:
    out: dict[int, dict] = {}
    with BenchDaemon(config, profile=profile, root=root) as d:
        async with connect(d.socket, "lanes-driver") as driver, \
                connect(d.socket, "lanes-mirror") as watcher:
            for n in counts:
                margin = 1.0 + n * 0.04
                runs: dict[str, list] = {"ours": [], "base": []}
                for r in range(rounds):
                    for which in (("base", "ours") if r % 2 == 0 else ("ours", "base")):
                        if which == "base":
                            lat = await _pipe_baseline(n, seconds, margin)
                            runs["base"].append({"p50": _pct(lat, 50), "p99": _pct(lat, 99)})
                        else:
                            x = await _lane_latency(d, driver, watcher, n, seconds, margin)
                            runs["ours"].append({"p50": _pct(x["lat"], 50),
                                                 "p99": _pct(x["lat"], 99),
                                                 "max": max(x["lat"]), "lines": len(x["lat"]),
                                                 "missed": x["missed"],
                                                 "batches": x["batches"], **x["cpu"]})
                out[n] = runs
    return out


# ------------------------------------------------------------------------------ leave
class LeaveWatcher:
    """A subscription followed in a task: when (perf_counter) each call first showed in
    ``recent``, and when the mirror's total window bytes of running calls first passed a mark."""

    def __init__(self, sub) -> None:
        self.sub = sub
        self.left: dict[str, float] = {}
        self.window_bytes = 0
        self._changed = trio.Event()

    async def run(self) -> None:
        async for view in self.sub:
            now = time.perf_counter()
            for entry in view["recent"]:
                self.left.setdefault(entry["callId"], now)
            self.window_bytes = sum(len(t["output"]["content"][0]["text"])
                                    for t in view["tools"].values())
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, predicate) -> float:
        while not predicate():
            await self._changed.wait()
        return time.perf_counter()


async def _leave_once(driver: Client, sid: str, w: LeaveWatcher, command: str) -> float:
    """Run ``command``; ms from tool.wait's answer to the mirror showing it in ``recent``."""
    cid = await driver.run_tool(sid, command)
    result = await driver.wait(sid, cid)
    answered = time.perf_counter()
    if result["isError"]:
        raise AssertionError(f"probe call failed: {result['content'][:200]}")
    left = await w.wait_for(lambda: cid in w.left)
    return (w.left[cid] - answered) * 1000


async def _after_big_batch(driver: Client, sid: str, w: LeaveWatcher, blob: Path,
                           bursts: int) -> tuple[float, int]:
    """``bursts`` calls each print 50 KB at one instant T (then stay running a while); the
    probe call exits 0.2 s after T, inside the byte pause of their batch (~0.5 s for 1 MiB at
    the default rate): ms from its tool.wait answer to its leaving the lane, and the window
    bytes the mirror showed when it left."""
    at = time.time() + 1.5 + bursts * 0.04
    wait_until = f"{PY} -c 'import time; time.sleep(max(0, {at:.6f} - time.time()))'"
    big = [await driver.run_tool(sid, f"{wait_until}; cat {blob}; sleep 1.5")
           for _ in range(bursts)]
    ms = await _leave_once(driver, sid, w, f"{wait_until}; sleep 0.2")
    shown = w.window_bytes
    if shown < min(256 * 1024, bursts * 40_000):  # at least ~5 windows (quick) or 256 KiB
        raise AssertionError(f"no big batch reached the mirror before the probe left ({shown} B)")
    for cid in big:
        await driver.wait(sid, cid)
    return ms, shown


async def bench_leave(rounds: int, bursts: int, root: Path = ROOT) -> dict:
    runs: dict[str, list[float]] = {"idle": [], "big batch": [], "1 MiB argument": [],
                                    "1 MiB output": []}
    with BenchDaemon(root=root) as d, trio.fail_after(60 + rounds * 60):
        blob = d.dir / "blob.b64"
        subprocess.run(f"head -c 38400 /dev/urandom | base64 -w 76 > {blob}", shell=True,
                       check=True)
        async with connect(d.socket, "leave-driver") as driver, \
                connect(d.socket, "leave-mirror") as watcher:
            sid = await driver.create_session(str(d.work), "leave", sandbox="danger-full-access")
            sub = await watcher.subscribe(sid)
            await sub.next_view()
            w = LeaveWatcher(sub)
            big_arg = "true " + "#" * MiB
            windows: list[int] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(w.run)
                for _ in range(rounds):
                    runs["idle"].append(await _leave_once(driver, sid, w, "true"))
                    ms, shown = await _after_big_batch(driver, sid, w, blob, bursts)
                    runs["big batch"].append(ms)
                    windows.append(shown)
                    runs["1 MiB argument"].append(await _leave_once(driver, sid, w, big_arg))
                    runs["1 MiB output"].append(await _leave_once(
                        driver, sid, w, "head -c 786432 /dev/urandom | base64 -w 76"))
                nursery.cancel_scope.cancel()
    return {"runs": runs, "windows": windows}


# ------------------------------------------------------------------------------ report
def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report_latency(r: dict) -> list[str]:
    lines = ["latency: N calls x 100 lines/s in one session, write -> mirror (ms; median "
             "(min-max) over rounds)"]
    for n, runs in r.items():
        o, b = runs["ours"], runs["base"]
        p50s, p99s = [x["p50"] for x in o], [x["p99"] for x in o]
        lines.append(
            f"  {n:3d} calls: dshd p50 {_spread(p50s)}, p99 {_spread(p99s)}, max "
            f"{max(x['max'] for x in o):.1f}; pipe baseline p50 "
            f"{_spread([x['p50'] for x in b])}, p99 {_spread([x['p99'] for x in b])}; "
            f"ratio p50 {statistics.median(p50s) / statistics.median([x['p50'] for x in b]):.1f}x")
        lines.append(
            f"             lines/round {[x['lines'] for x in o]}, missed "
            f"{[x['missed'] for x in o]}, batches {[x['batches'] for x in o]}, daemon CPU "
            f"{_spread([100 * x.get('daemon', 0) for x in o], 0)} %, call hosts "
            f"{_spread([100 * x.get('hosts', 0) for x in o], 0)} % (per host "
            f"{_spread([100 * x.get('hosts', 0) / max(1, x.get('hosts_seen', 0)) for x in o], 1)}"
            f" %), the mirror client "
            f"{_spread([100 * x.get('client', 0) for x in o], 0)} % of a core")
        if n == 100:
            ok = statistics.median(p50s) <= GOAL_P50_MS and statistics.median(p99s) <= GOAL_P99_MS
            lines.append(f"  goal (100 calls): p50 <= {GOAL_P50_MS:g} ms, p99 <= "
                         f"{GOAL_P99_MS:g} ms: {_met(ok)}")
    return lines


def report_leave(result: dict) -> list[str]:
    r = result["runs"]
    lines = ["leave: ms from tool.wait's answer to the mirror showing the call in recent "
             "(median (min-max); negative: the mirror saw it first)"]
    lines.append(f"  (big batch: the mirror showed {_spread([x / 1e6 for x in result['windows']])}"
                 " MB of running calls' windows when the probe left)")
    base = r["idle"]
    for name, values in r.items():
        tag = "baseline" if name == "idle" else f"vs idle {statistics.median(values) - statistics.median(base):+.1f} ms"
        lines.append(f"  {name:15s}: {_spread(values)}  [{tag}]")
    worst = max(max(v) for k, v in r.items() if k != "idle")
    lines.append(f"  goal: <= {GOAL_LEAVE_MS:g} ms in every round (worst {worst:.1f} ms): "
                 f"{_met(worst <= GOAL_LEAVE_MS)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lanes", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--only", action="append", choices=["latency", "leave"])
    p.add_argument("--calls", type=int, action="append", help="call counts (repeat)")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--seconds", type=float, default=None, help="steady seconds per round")
    p.add_argument("--root", type=Path, default=ROOT, metavar="DIR",
                   help="the source tree whose dshd runs (e.g. an export of main, to compare)")
    p.add_argument("--profile", type=Path, default=None, metavar="FILE",
                   help="run the latency daemon under py-spy; its raw profile goes to FILE")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a dshd config value for the latency daemon (e.g. publish_rate_bytes)")
    args = p.parse_args(argv)
    counts = args.calls or ([1, 10] if args.quick else [1, 10, 50, 100])
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    status = 0
    for name in args.only or ["latency", "leave"]:
        t0 = time.perf_counter()
        try:
            if name == "latency":
                config = {k: float(v) if "." in v else int(v)
                          for k, v in (x.split("=", 1) for x in args.set)}
                lines = report_latency(trio.run(bench_latency, counts, rounds, seconds, config,
                                                args.profile, args.root))
                if args.profile is not None:
                    lines += [f"  profile {args.profile} (inclusive, top 25):"] + [
                        f"    {share:6.1%}  {frame}"
                        for share, frame in top_frames(args.profile, 25, own=False)]
            else:
                lines = report_leave(trio.run(bench_leave, rounds if not args.quick else 1,
                                              5 if args.quick else 21, args.root))
        except Exception as exc:  # noqa: BLE001 - one broken bench must not hide the other
            import traceback

            status = 1
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exception(exc, file=sys.stdout)
            continue
        print("\n".join(lines) + f"  [{time.perf_counter() - t0:.1f} s]", flush=True)
    if args.quick:
        print("(--quick: sizes too small for the goals; a smoke run, not figures)")
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
