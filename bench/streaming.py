"""Streaming benches (issue 6): throughput, latency, wire, memory, fan-out, protocol micro.

Theory of operation: every figure is printed next to a baseline measured in the same run and
their ratio, and a closing table says which target is met. The daemon benches start real
``dshd`` subprocesses (``bench.dshd_proc.BenchDaemon``: short /tmp paths, JSON logs, killed
at the end however the bench ends) and drive them with the real client library: every
"client" is a ``client.api`` connection whose ``Subscription`` applies every batch to its
mirror. The wire and micro benches run in process (``bench.wire``). Runs are bounded in time
(``trio.fail_after``) and in count; nothing asserts on time.

* **throughput**: ``yes … | head -c SIZE`` through ``tool.run`` with 3 subscribed clients,
  from the request until every mirror shows the call settled (its last window checked against
  ``tool.wait``), vs the shell pipeline ``CMD | tee SPILL | tail -c 51200 >/dev/null`` (the
  same work: a spill file and a tail window). Rounds alternate; the best of each is kept.
  Spill files are unlinked after each run, so no run pays for an earlier one's writeback.
* **latency**: a tool prints ``time.time_ns()`` lines; a client computes ``now - stamp`` when
  each line appears in its mirror; p50/p99. Twice: at exactly 100 lines/s (an absolute
  schedule: the line period equals the publish interval, the hard case for pacing) and in the
  issue's literal form (print, sleep 10 ms: ~98/s). Baseline: the exact tool read straight
  from a pipe by this process (the floor: pipe + wakeup).
* **wire**: ``bench.wire.wire_efficiency`` (256 KB build log, 50 KB window, 20 flushes).
* **memory**: daemon peak RSS (VmHWM) while SIZE of non-repetitive output (``seq``) streams to
  10 clients, one of which (a raw socket with small buffers) stops reading for STALL seconds,
  then reads again and must heal (base batch). Baseline: the daemon's RSS with the 10 clients
  attached, before the command. (At default limits a 10 s stall fits the 4 MiB stream budget,
  since pacing holds the lane near 256 KiB/s of ops: "dropped batches" says whether the
  drop-and-rebase path ran.)
* **fanout**: 200 subscribers (one connection each) on one call streaming ``seq`` output; the
  fast subscribers' throughput (output bytes / time until their mirror shows the call settled)
  with one stalled subscriber vs with none. Rounds alternate.
* **micro**: ``bench.wire.microbench``: produce/encode/decode/apply ops/s.

``--quick`` shrinks every size for a smoke run; ``--only NAME`` runs some; ``--profile DIR``
runs the daemons under ``py-spy record`` (figures then include its overhead) and prints their
heaviest frames.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from client.api import Client, connect

from .dshd_proc import BenchDaemon, StalledReader, top_frames
from .wire import microbench, wire_efficiency

BENCHES = ["throughput", "latency", "wire", "memory", "fanout", "micro"]

MiB = 1024 * 1024
YES_LINE = "dshd throughput bench: g++ -O2 -c src/core/session.cc -o build/session.o"


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


class Watcher:
    """One client's subscription, followed in a task: remembers per call its last window,
    its last totalBytes and when (perf_counter) the mirror first showed it settled."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.sub = None
        self.last_text: dict[str, str] = {}
        self.last_total: dict[str, int] = {}
        self.settled: dict[str, float] = {}
        self.batches = 0
        self._changed = trio.Event()

    async def open(self, session_id: str) -> None:
        self.sub = await self.client.subscribe(session_id)
        await self.sub.next_view()  # the base batch

    async def run(self) -> None:
        assert self.sub is not None
        async for view in self.sub:
            now = time.perf_counter()
            self.batches += 1
            for cid, tool in view["tools"].items():
                out = tool["output"]
                self.last_text[cid] = out["content"][0]["text"]
                self.last_total[cid] = out["truncation"]["totalBytes"]
            for entry in view["recent"]:
                if entry["callId"] not in self.settled:
                    self.settled[entry["callId"]] = now
            self._changed.set()
            self._changed = trio.Event()

    async def wait_settled(self, call_id: str) -> float:
        while call_id not in self.settled:
            await self._changed.wait()
        return self.settled[call_id]


async def _watchers(socket: Path, session_id: str, n: int, stack: AsyncExitStack,
                    name: str) -> list[Watcher]:
    """``n`` connected, subscribed watchers (connections owned by ``stack``); start their
    ``run`` in a nursery opened *after* (inside) the stack."""
    out = []
    for i in range(n):
        client = await stack.enter_async_context(connect(socket, f"{name}-{i}"))
        w = Watcher(client)
        await w.open(session_id)
        out.append(w)
    return out


async def throughput_rig(d: BenchDaemon, title: str, stack: AsyncExitStack
                         ) -> tuple[Client, str, list[Watcher]]:
    """A driver connection, a ``danger-full-access`` session and 3 subscribed watchers, for a
    throughput run (connections owned by ``stack``)."""
    driver = await stack.enter_async_context(connect(d.socket, "bench-driver"))
    sid = await driver.create_session(str(d.work), title, sandbox="danger-full-access")
    return driver, sid, await _watchers(d.socket, sid, 3, stack, "tp")


def _check_window(watchers: list[Watcher], call_id: str, result: dict) -> None:
    for w in watchers:
        if w.last_text.get(call_id) != result["content"]:
            raise AssertionError("a mirror's last window differs from the call's result")


# ------------------------------------------------------------------------------ throughput
async def bench_throughput(size: int, rounds: int, profile: Path | None) -> dict:
    cmd = f"yes '{YES_LINE}' | head -c {size}"
    ours: list[float] = []
    base: list[float] = []
    cpu: list[float] = []
    with BenchDaemon(profile=profile) as d:
        spill = d.dir / "baseline.spill"
        async with AsyncExitStack() as stack:
            driver, sid, watchers = await throughput_rig(d, "throughput", stack)
            async with trio.open_nursery() as nursery:
                for w in watchers:
                    nursery.start_soon(w.run)
                for r in range(rounds):
                    order = ("base", "ours") if r % 2 == 0 else ("ours", "base")
                    for which in order:
                        if which == "base":
                            t0 = time.perf_counter()
                            await trio.run_process(
                                ["sh", "-c", f"{cmd} | tee {spill} | tail -c 51200 >/dev/null"],
                                check=True)
                            base.append(time.perf_counter() - t0)
                            spill.unlink()
                            continue
                        c0 = d.cpu_seconds()
                        with trio.fail_after(120):
                            t0 = time.perf_counter()
                            cid = await driver.run_tool(sid, cmd)
                            result = await driver.wait(sid, cid)
                            done = max([await w.wait_settled(cid) for w in watchers])
                        ours.append(done - t0)
                        cpu.append(d.cpu_seconds() - c0)
                        if result["details"]["truncation"]["totalBytes"] != size:
                            raise AssertionError(f"dshd saw {result['details']['truncation']}")
                        _check_window(watchers, cid, result)
                        # Unlinked before writeback, its dirty pages never reach the disk
                        # (as the baseline's): later rounds do not pay for earlier ones.
                        Path(result["details"]["spillPath"]).unlink()
                nursery.cancel_scope.cancel()
        batches = [w.batches for w in watchers]
    b, o = min(base), min(ours)
    return {"size": size, "rounds": rounds, "baseline_s": b, "ours_s": o, "ratio": o / b,
            "baseline_all": base, "ours_all": ours, "daemon_cpu_s": min(cpu),
            "client_batches": batches, "profile": profile}


# ------------------------------------------------------------------------------ latency
def _stamp_tool(lines: int, *, exact: bool = True) -> str:
    """A tool printing ``time.time_ns()`` lines: at exactly 100/s (an absolute schedule), or
    the issue's literal form (print, then sleep 10 ms: a little under 100/s)."""
    if exact:
        prog = ("import time,sys\n"
                "t0=time.monotonic()\n"
                f"for i in range({lines}):\n"
                "    sys.stdout.write(str(time.time_ns())+'\\n'); sys.stdout.flush()\n"
                "    d=t0+(i+1)*0.01-time.monotonic()\n"
                "    d>0 and time.sleep(d)\n")
    else:
        prog = ("import time,sys\n"
                f"for i in range({lines}):\n"
                "    sys.stdout.write(str(time.time_ns())+'\\n'); sys.stdout.flush()\n"
                "    time.sleep(0.01)\n")
    return f"python3 -c \"{prog}\""


async def _baseline_latency(lines: int) -> list[float]:
    """The same tool read straight from a pipe by this trio process."""
    cmd = _stamp_tool(lines)
    lat: list[float] = []
    proc = await trio.lowlevel.open_process(["sh", "-c", cmd], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    buf = b""
    try:
        with trio.fail_after(lines * 0.01 + 30):
            while True:
                data = await proc.stdout.receive_some(65536)
                now = time.time_ns()
                if not data:
                    break
                buf += data
                *done, buf = buf.split(b"\n")
                lat.extend((now - int(x)) / 1e6 for x in done if x)
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return lat


async def _mirror_latency(driver: Client, client: Client, sid: str, lines: int,
                          exact: bool) -> tuple[list[float], int]:
    """Run the stamp tool; the latency of each line as it appears in ``client``'s mirror."""
    lat: list[float] = []
    batches = 0
    sub = await client.subscribe(sid)
    await sub.next_view()
    cid = await driver.run_tool(sid, _stamp_tool(lines, exact=exact))
    pos = 0
    with trio.fail_after(lines * 0.02 + 60):
        async for view in sub:
            now = time.time_ns()
            batches += 1
            tool = view["tools"].get(cid)
            if tool is None:
                if any(r["callId"] == cid for r in view["recent"]):
                    break
                continue
            text = tool["output"]["content"][0]["text"]
            if len(text) < pos:
                raise AssertionError("the window slid: too many lines for this bench")
            end = text.rfind("\n") + 1
            if end > pos:
                lat.extend((now - int(x)) / 1e6 for x in text[pos:end].split("\n") if x)
                pos = end
    result = await driver.wait(sid, cid)
    await sub.aclose()
    if len(lat) != lines or result.get("isError"):
        raise AssertionError(f"saw {len(lat)} of {lines} lines; result {result.get('errorCode')}")
    return lat, batches


async def bench_latency(lines: int, profile: Path | None) -> dict:
    base = await _baseline_latency(lines)
    with BenchDaemon(profile=profile) as d:
        async with connect(d.socket, "bench-driver") as driver, connect(d.socket, "lat") as client:
            sid = await driver.create_session(str(d.work), "latency", sandbox="danger-full-access")
            exact, batches = await _mirror_latency(driver, client, sid, lines, True)
            sleepy, _ = await _mirror_latency(driver, client, sid, lines, False)
    return {"lines": lines, "batches": batches,
            "p50_ms": _pct(exact, 50), "p99_ms": _pct(exact, 99), "max_ms": max(exact),
            "sleep_p50_ms": _pct(sleepy, 50), "sleep_p99_ms": _pct(sleepy, 99),
            "sleep_max_ms": max(sleepy),
            "base_p50_ms": _pct(base, 50), "base_p99_ms": _pct(base, 99),
            "profile": profile}


# ------------------------------------------------------------------------------ memory
async def bench_memory(size: int, stall: float, profile: Path | None) -> dict:
    cmd = f"seq 1 999999999 | head -c {size}"
    with BenchDaemon(profile=profile) as d:
        async with AsyncExitStack() as stack:
            driver = await stack.enter_async_context(connect(d.socket, "bench-driver"))
            sid = await driver.create_session(str(d.work), "memory", sandbox="danger-full-access")
            stalled = StalledReader(d.socket)
            stack.callback(stalled.close)
            await trio.to_thread.run_sync(stalled.subscribe, sid)
            await trio.to_thread.run_sync(stalled.read_batch, 10.0)  # its base batch
            watchers = await _watchers(d.socket, sid, 9, stack, "mem")
            async with trio.open_nursery() as nursery:
                for w in watchers:
                    nursery.start_soon(w.run)
                await trio.sleep(0.2)
                idle_rss = d.rss_kib()
                samples: list[int] = []

                async def sample() -> None:
                    while True:
                        samples.append(d.rss_kib())
                        await trio.sleep(0.1)

                nursery.start_soon(sample)
                with trio.fail_after(stall + 300):
                    t0 = time.perf_counter()
                    cid = await driver.run_tool(sid, cmd)
                    await trio.sleep(stall)  # the stalled client reads nothing meanwhile
                    stall_rss = d.rss_kib()

                    def catch_up() -> None:
                        # Read again until the mirror shows the call settled: every batch must
                        # apply (a gap would raise), and a dropped subscription gets a base.
                        while True:
                            if stalled.read_batch(60.0) is None:
                                raise AssertionError("the stalled client got nothing for 60 s")
                            v = stalled.mirror.value
                            if v is not None and any(r["callId"] == cid for r in v["recent"]):
                                return

                    await trio.to_thread.run_sync(catch_up)
                    result = await driver.wait(sid, cid)
                    done = max([await w.wait_settled(cid) for w in watchers])
                _check_window(watchers, cid, result)
                Path(result["details"]["spillPath"]).unlink()  # no writeback for later benches
                elapsed = done - t0
                status = await driver.status()
                peak = d.peak_rss_kib()
                nursery.cancel_scope.cancel()
        if result["details"]["truncation"]["totalBytes"] != size:
            raise AssertionError(f"dshd saw {result['details']['truncation']}")
    return {"size": size, "stall_s": stall, "idle_rss_kib": idle_rss, "peak_rss_kib": peak,
            "rss_after_stall_kib": stall_rss, "max_sampled_rss_kib": max(samples),
            "seconds": elapsed, "dropped_batches": status.get("droppedBatches"),
            "stalled_bases": stalled.bases, "stalled_batches": stalled.batches,
            "profile": profile}


# ------------------------------------------------------------------------------ fan-out
async def bench_fanout(subscribers: int, size: int, rounds: int, profile: Path | None) -> dict:
    cmd = f"seq 1 999999999 | head -c {size}"
    runs: dict[str, list[dict]] = {"none": [], "stalled": []}
    with BenchDaemon(profile=profile) as d, trio.fail_after(120 + rounds * 360):
        async with AsyncExitStack() as stack:
            driver = await stack.enter_async_context(connect(d.socket, "bench-driver"))
            sid = await driver.create_session(str(d.work), "fanout", sandbox="danger-full-access")
            watchers = await _watchers(d.socket, sid, subscribers - 1, stack, "fan")
            # The subscriber that stalls in "stalled" runs; in "none" runs it reads too.
            last = StalledReader(d.socket)
            stack.callback(last.close)
            await trio.to_thread.run_sync(last.subscribe, sid)
            async with trio.open_nursery() as nursery:
                for w in watchers:
                    nursery.start_soon(w.run)
                for r in range(2 * rounds):
                    which = ("none", "stalled")[(r + r // 2) % 2]  # none, stalled, stalled, none…
                    stop_reading = False

                    def read_all() -> None:
                        while not stop_reading:
                            last.read_batch(0.2)

                    with trio.fail_after(180):
                        async with trio.open_nursery() as inner:
                            if which == "none":
                                inner.start_soon(trio.to_thread.run_sync, read_all)
                            t0 = time.perf_counter()
                            cid = await driver.run_tool(sid, cmd)
                            result = await driver.wait(sid, cid)
                            t_cmd = time.perf_counter() - t0
                            settled = [await w.wait_settled(cid) - t0 for w in watchers]
                            stop_reading = True
                        _check_window(watchers, cid, result)
                        Path(result["details"]["spillPath"]).unlink()
                        if which == "stalled":
                            # Heal the stalled one before the next run: read until settled.
                            def catch_up() -> None:
                                while True:
                                    if last.read_batch(60.0) is None:
                                        raise AssertionError("stalled subscriber got nothing")
                                    v = last.mirror.value
                                    if v is not None and any(e["callId"] == cid for e in v["recent"]):
                                        return

                            await trio.to_thread.run_sync(catch_up)
                    total = result["details"]["truncation"]["totalBytes"]
                    runs[which].append({
                        "cmd_s": t_cmd,
                        "median_s": statistics.median(settled),
                        "max_s": max(settled),
                        "mbps_median": total / statistics.median(settled) / 1e6,
                        "mbps_slowest": total / max(settled) / 1e6,
                    })
                nursery.cancel_scope.cancel()
            status = await driver.status()

    def best(which: str, key: str) -> float:
        return max(x[key] for x in runs[which])

    none, stalled = best("none", "mbps_median"), best("stalled", "mbps_median")
    return {"subscribers": subscribers, "size": size, "rounds": rounds, "runs": runs,
            "none_mbps": none, "stalled_mbps": stalled, "ratio": stalled / none,
            "none_slowest_mbps": best("none", "mbps_slowest"),
            "stalled_slowest_mbps": best("stalled", "mbps_slowest"),
            "dropped_batches": status.get("droppedBatches"), "profile": profile}


# ------------------------------------------------------------------------------ report
def _sizes(quick: bool) -> dict:
    if quick:
        return {"tp_size": 32 * MiB, "tp_rounds": 1, "lat_lines": 200, "wire_size": 256 * 1024,
                "mem_size": 128 * MiB, "stall": 2.0, "fan_subs": 50, "fan_size": 16 * MiB,
                "fan_rounds": 1, "micro_lines": 1000, "micro_seconds": 0.1}
    return {"tp_size": 256 * MiB, "tp_rounds": 2, "lat_lines": 1000, "wire_size": 256 * 1024,
            "mem_size": 1024 * MiB, "stall": 10.0, "fan_subs": 200, "fan_size": 256 * MiB,
            "fan_rounds": 3, "micro_lines": 4000, "micro_seconds": 0.5}


def _profile_lines(path: Path | None) -> list[str]:
    if path is None or not path.exists():
        return []
    lines = [f"  profile {path} (self time, top 10):"]
    for share, frame in top_frames(path, 10):
        lines.append(f"    {share:6.1%}  {frame}")
    return lines


def _run(name: str, z: dict, profile_dir: Path | None) -> tuple[dict, list[str], list[tuple]]:
    """Run one bench; returns (figures, printed lines, table rows)."""
    prof = (profile_dir / f"{name}.raw") if profile_dir is not None else None
    rows: list[tuple] = []
    if name == "throughput":
        r = trio.run(bench_throughput, z["tp_size"], z["tp_rounds"], prof)
        mb = r["size"] / 1e6
        lines = [f"throughput: {r['size'] // MiB} MiB of `yes`, 3 clients with mirrors, "
                 f"best of {r['rounds']}",
                 f"  baseline `CMD | tee SPILL | tail -c 51200`: {r['baseline_s']:.3f} s "
                 f"({mb / r['baseline_s']:.0f} MB/s)  all: {[round(x, 3) for x in r['baseline_all']]}",
                 f"  dshd (run -> 3 mirrors settled): {r['ours_s']:.3f} s ({mb / r['ours_s']:.0f} MB/s), "
                 f"daemon CPU {r['daemon_cpu_s']:.2f} s  all: {[round(x, 3) for x in r['ours_all']]}",
                 f"  ratio {r['ratio']:.2f}x (target <= 1.5x); batches per client "
                 f"{r['client_batches']}"]
        rows.append(("throughput (s)", f"{r['baseline_s']:.3f}", f"{r['ours_s']:.3f}",
                     f"{r['ratio']:.2f}x", "<= 1.5x", r["ratio"] <= 1.5))
    elif name == "latency":
        r = trio.run(bench_latency, z["lat_lines"], prof)
        lines = [f"latency: {r['lines']} lines, tool print -> client mirror "
                 f"({r['batches']} batches)",
                 f"  baseline (the exact-100/s tool read from a pipe here): p50 "
                 f"{r['base_p50_ms']:.2f} ms, p99 {r['base_p99_ms']:.2f} ms",
                 f"  dshd, exactly 100 lines/s: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                 f"max {r['max_ms']:.2f} ms",
                 f"  dshd, print + sleep 10 ms (~98/s): p50 {r['sleep_p50_ms']:.2f} ms, p99 "
                 f"{r['sleep_p99_ms']:.2f} ms, max {r['sleep_max_ms']:.2f} ms"]
        b50, b99 = r["base_p50_ms"], r["base_p99_ms"]
        for label, p50, p99 in (("100/s", r["p50_ms"], r["p99_ms"]),
                                ("sleep 10ms", r["sleep_p50_ms"], r["sleep_p99_ms"])):
            rows.append((f"latency p50 ms, {label}", f"{b50:.2f}", f"{p50:.2f}",
                         f"{p50 / b50:.1f}x", "<= 5 ms", p50 <= 5))
            rows.append((f"latency p99 ms, {label}", f"{b99:.2f}", f"{p99:.2f}",
                         f"{p99 / b99:.1f}x", "<= 30 ms", p99 <= 30))
    elif name == "wire":
        r = wire_efficiency(size=z["wire_size"])
        c, cl = r["codec"], r["codec_line_rate"]
        lines = [f"wire: {r['output_bytes'] // 1024} KiB build log, 50 KB window, "
                 f"{r['flushes']} flushes ({r['batches']} batches incl. base, call start/end)",
                 f"  notification bytes {r['wire_bytes']:,} = {r['wire_ratio']:.3f}x output "
                 f"(target <= 1.2x); snapshot-per-flush {r['snapshot_bytes']:,} = "
                 f"{r['snapshot_ratio']:.2f}x output",
                 f"  codec vs inline paths, delta batches: all bytes {c['inline_bytes']:,} -> "
                 f"{c['wire_bytes']:,} ({c['savings']:.1%}); non-payload bytes "
                 f"{c['structure_inline']:,} -> {c['structure_wire']:,} "
                 f"({c['structure_savings']:.1%})",
                 f"  line-rate stream (one flush per line, 1000 lines): all bytes "
                 f"{cl['inline_bytes']:,} -> {cl['wire_bytes']:,} ({cl['savings']:.1%}); "
                 f"non-payload {cl['structure_savings']:.1%}; wire/output "
                 f"{r['line_rate_wire_ratio']:.2f}x"]
        rows.append(("wire bytes / output", f"{r['output_bytes']:,}", f"{r['wire_bytes']:,}",
                     f"{r['wire_ratio']:.3f}x", "<= 1.2x", r["wire_ratio"] <= 1.2))
        rows.append(("wire vs snapshot/flush", f"{r['snapshot_bytes']:,}", f"{r['wire_bytes']:,}",
                     f"{r['wire_bytes'] / r['snapshot_bytes']:.2f}x", "(info)", None))
        rows.append(("codec savings, hot path", f"{cl['inline_bytes']:,}", f"{cl['wire_bytes']:,}",
                     f"{cl['savings']:.1%}", ">= 33%", cl["savings"] >= 0.33))
        rows.append(("codec savings, 20 flushes", f"{c['inline_bytes']:,}", f"{c['wire_bytes']:,}",
                     f"{c['savings']:.1%} ({c['structure_savings']:.0%} non-payload)", "(info)",
                     None))
    elif name == "memory":
        r = trio.run(bench_memory, z["mem_size"], z["stall"], prof)
        lines = [f"memory: {r['size'] // MiB} MiB of `seq` to 10 clients, one stalled "
                 f"{r['stall_s']:g} s ({r['seconds']:.1f} s run)",
                 f"  baseline: daemon RSS with 10 clients attached, idle: "
                 f"{r['idle_rss_kib'] / 1024:.1f} MiB",
                 f"  peak RSS (VmHWM) {r['peak_rss_kib'] / 1024:.1f} MiB, sampled max "
                 f"{r['max_sampled_rss_kib'] / 1024:.1f} MiB, at stall end "
                 f"{r['rss_after_stall_kib'] / 1024:.1f} MiB; dropped batches "
                 f"{r['dropped_batches']}; the stalled client healed with "
                 f"{r['stalled_bases']} base batches in {r['stalled_batches']}"]
        ratio = r["peak_rss_kib"] / r["idle_rss_kib"]
        rows.append(("memory peak RSS (MiB)", f"{r['idle_rss_kib'] / 1024:.1f}",
                     f"{r['peak_rss_kib'] / 1024:.1f}", f"{ratio:.2f}x", "<= 100 MB",
                     r["peak_rss_kib"] * 1024 <= 100e6))
    elif name == "fanout":
        r = trio.run(bench_fanout, z["fan_subs"], z["fan_size"], z["fan_rounds"], prof)
        lines = [f"fan-out: {r['subscribers']} subscribers, {r['size'] // MiB} MiB of `seq`, "
                 f"best of {r['rounds']} each (MB/s of output reaching the fast mirrors)"]
        for which in ("none", "stalled"):
            for x in r["runs"][which]:
                lines.append(f"  {which:7s}: command {x['cmd_s']:.2f} s; fast mirrors settled "
                             f"median {x['median_s']:.2f} s ({x['mbps_median']:.0f} MB/s), "
                             f"slowest {x['max_s']:.2f} s ({x['mbps_slowest']:.0f} MB/s)")
        lines.append(f"  ratio stalled/none {r['ratio']:.2f} (target >= 0.80); slowest "
                     f"{r['stalled_slowest_mbps'] / r['none_slowest_mbps']:.2f}; "
                     f"dropped batches {r['dropped_batches']}")
        rows.append(("fan-out fast MB/s", f"{r['none_mbps']:.0f}", f"{r['stalled_mbps']:.0f}",
                     f"{r['ratio']:.2f}", ">= 0.80", r["ratio"] >= 0.8))
    elif name == "micro":
        r = microbench(lines=z["micro_lines"], min_seconds=z["micro_seconds"])
        rt = r["rates"]
        lines = [f"micro: rolling-window line-rate stream, {r['batches']} batches, "
                 f"{r['ops_per_batch']:.1f} ops/batch, 50 KB window",
                 "  ops/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in rt.items()),
                 f"  per batch: encode+decode+apply {r['us_per_batch']:.1f} us vs snapshot "
                 f"(msgspec encode+decode of the ToolOutput) {r['snapshot_us_per_batch']:.1f} us "
                 f"-> {r['ratio']:.2f}x"]
        rows.append(("micro us/batch", f"{r['snapshot_us_per_batch']:.1f}",
                     f"{r['us_per_batch']:.1f}", f"{r['ratio']:.2f}x", "(info)", None))
    else:
        raise ValueError(name)
    return r, lines + _profile_lines(prof), rows


def table(rows: list[tuple]) -> str:
    head = ("benchmark", "baseline", "dshd", "ratio", "target", "met")
    body = [tuple(str(x) for x in row[:5]) + ({True: "yes", False: "NO", None: "-"}[row[5]],)
            for row in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(6)]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*r) for r in body])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.streaming",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--only", action="append", choices=BENCHES, help="run only these (repeat)")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR",
                   help="run each daemon under py-spy; raw profiles go to DIR")
    args = p.parse_args(argv)
    z = _sizes(args.quick)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows: list[tuple] = []
    failed = 0
    for name in args.only or BENCHES:
        t0 = time.perf_counter()
        try:
            _, lines, r = _run(name, z, args.profile)
        except Exception as exc:  # noqa: BLE001 - one broken bench must not hide the others
            failed = 1
            import traceback

            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exception(exc, file=sys.stdout)
            continue
        rows.extend(r)
        print("\n".join(lines) + f"  [{time.perf_counter() - t0:.1f} s]", flush=True)
    print()
    if args.quick:
        print("(--quick: sizes too small for the targets; a smoke run, not figures)")
    print(table(rows))
    return failed


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
