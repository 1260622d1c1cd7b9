"""Streaming benches (issues 6, 14): throughput, latency, wire, memory, fan-out, protocol micro.

Theory of operation: every figure is printed next to a baseline measured in the same run and
their ratio, and a closing table says which target is met. The daemon benches start real
``dshd`` subprocesses (``bench.dshd_proc.BenchDaemon``: short /tmp paths, JSON logs, killed
at the end however the bench ends) and drive them with the real client library: every
"client" is a ``client.api`` connection whose ``Subscription`` applies every batch to its
mirror. The in-process wire replay and the micro run in process (``bench.wire``). Runs are bounded in time
(``trio.fail_after``) and in count; nothing asserts on time.

* **throughput**: per source -- ``yes`` (a repeating window: few real changes), ``seq`` and
  base64 (non-repeating: every publish changes the window) -- SIZE bytes through ``tool.run``
  with 3 subscribed clients, from the request until every mirror shows the call settled (its
  last window checked against ``tool.wait``), vs the shell pipeline ``CMD | tee SPILL | tail -c
  51200 >/dev/null`` (the same work: a spill file and a tail window). Rounds alternate; the
  median and min-max of each are printed, and the ratio per round (never a best-of). Spill
  files are unlinked after each run, so no run pays for an earlier one's writeback.
* **latency**: a tool prints ``time.time_ns()`` lines; a client computes ``now - stamp`` when
  each line appears in its mirror; p50/p99. Twice: at exactly 100 lines/s (an absolute
  schedule: the line period equals the publish interval, the hard case for pacing) and in the
  issue's literal form (print, sleep 10 ms: ~98/s). Baseline: the exact tool read straight
  from a pipe by this process (the floor: pipe + wakeup). (Many calls at once: ``bench.lanes``.)
* **wire**: the real wire -- the bytes a real daemon puts on a real socket for one subscribed
  raw client (which applies every batch to its mirror) per byte of output, for a build log's
  short lines at 100 lines/s and for the same log in bulk; beside it, for information, the
  in-process replay of ``bench.wire.wire_efficiency`` (chosen chunking, no daemon).
* **memory**: daemon peak RSS (VmHWM) while 8 calls stream non-repeating ``seq`` output to 10
  clients, one of which (a raw socket with small buffers) stops reading for STALL seconds,
  then reads again and must heal. The lane carries enough bytes that the stalled client's
  stream budget (``send_queue_stream_bytes``, 1 MiB here: ``MEMORY_STREAM_BUDGET``) fills: its batches are dropped and it is rebased
  when it reads again; the bench prints how many drops and rebases happened and fails loudly
  when there were none (then it measured nothing of that path). Baseline: the daemon's RSS
  with the 10 clients attached, before the commands.
* **fanout**: 200 subscribers (one connection each) on one call streaming ``seq`` output; the
  fast subscribers' throughput (output bytes / time until their mirror shows the call settled)
  with one stalled subscriber vs with none, runs interleaved. It prints the medians, the
  stall's effect and the run-to-run noise (the larger min-max range / median of the two
  conditions), and says whether the effect is larger than the noise.
* **micro**: ``bench.wire.microbench``: produce (the producer's diff on the tracker) / encode /
  decode / apply ops/s, and all four per batch vs a snapshot protocol's encode + decode.

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
from .lanes import PY
from .wire import build_log, microbench, wire_efficiency

BENCHES = ["throughput", "latency", "wire", "memory", "fanout", "micro"]

MiB = 1024 * 1024
YES_LINE = "dshd throughput bench: g++ -O2 -c src/core/session.cc -o build/session.o"


def _spread(values: list[float], digits: int = 2) -> str:
    """``median (min-max)``."""
    return (f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-"
            f"{max(values):.{digits}f})")


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
#: The throughput sources: ``yes`` (a repeating window: few real changes), ``seq`` and base64
#: (non-repeating: every publish changes the window).
SOURCES = {
    "yes": lambda size: f"yes '{YES_LINE}' | head -c {size}",
    "seq": lambda size: f"seq 1 999999999 | head -c {size}",
    "base64": lambda size: f"head -c {size * 3 // 4 + 3} /dev/urandom | base64 -w 76 | head -c {size}",
}


async def bench_throughput(size: int, rounds: int, profile: Path | None) -> dict:
    """Per source, ``rounds`` interleaved rounds of dshd vs the shell baseline: median and
    min–max of each (never a best-of)."""
    out: dict[str, dict] = {}
    with BenchDaemon(profile=profile) as d:
        spill = d.dir / "baseline.spill"
        async with AsyncExitStack() as stack:
            driver, sid, watchers = await throughput_rig(d, "throughput", stack)
            async with trio.open_nursery() as nursery:
                for w in watchers:
                    nursery.start_soon(w.run)
                for source, make in SOURCES.items():
                    cmd = make(size)
                    ours: list[float] = []
                    base: list[float] = []
                    cpu: list[float] = []
                    for r in range(rounds):
                        for which in (("base", "ours") if r % 2 == 0 else ("ours", "base")):
                            if which == "base":
                                t0 = time.perf_counter()
                                await trio.run_process(["sh", "-c", f"{cmd} | tee {spill} | "
                                                        "tail -c 51200 >/dev/null"], check=True)
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
                    b, o = statistics.median(base), statistics.median(ours)
                    ratios = [x / y for x, y in zip(ours, base)]  # per interleaved round
                    out[source] = {"baseline_s": b, "ours_s": o, "ratio": statistics.median(ratios),
                                   "ratios": ratios,
                                   "baseline_all": base, "ours_all": ours,
                                   "daemon_cpu_s": statistics.median(cpu)}
                nursery.cancel_scope.cancel()
        batches = [w.batches for w in watchers]
    return {"size": size, "rounds": rounds, "sources": out, "client_batches": batches,
            "profile": profile}


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
    return f"{PY} -c \"{prog}\""


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


# ------------------------------------------------------------------------------ real wire
#: Writes the lines of the file argv[1] at 100 lines/s (an absolute schedule).
LINE_RATE_PROG = ("import sys,time\n"
                  "t0=time.monotonic()\n"
                  "for i,l in enumerate(open(sys.argv[1],'rb')):\n"
                  "    d=t0+i*0.01-time.monotonic()\n"
                  "    d>0 and time.sleep(d)\n"
                  "    sys.stdout.buffer.write(l); sys.stdout.flush()\n")


async def _wire_case(driver: Client, sid: str, reader: StalledReader, cmd: str,
                     size: int, seconds: float) -> dict:
    reader.bytes = 0
    cid = await driver.run_tool(sid, cmd)

    def follow() -> int:
        n = 0
        while True:
            if reader.read_batch(60.0) is None:
                raise AssertionError("the wire reader got nothing for 60 s")
            n += 1
            v = reader.mirror.value
            if v is not None and any(e["callId"] == cid for e in v["recent"]):
                return n

    with trio.fail_after(seconds + 120):
        batches = await trio.to_thread.run_sync(follow)
    result = await driver.wait(sid, cid)
    if result["details"]["truncation"]["totalBytes"] != size:
        raise AssertionError(f"dshd saw {result['details']['truncation']}")
    return {"output_bytes": size, "wire_bytes": reader.bytes, "batches": batches,
            "ratio": reader.bytes / size}


async def bench_wire_real(lines: int, bulk_size: int) -> dict:
    """Bytes on a real socket to a real subscribed client (a raw reader that applies every
    batch to its mirror), per byte of the command's output: a build log's lines at 100/s, and
    the same log in bulk (``cat``)."""
    out: dict[str, dict] = {}
    with BenchDaemon() as d:
        data = build_log(max(bulk_size, lines * 80))
        small = d.dir / "lines.log"
        small.write_bytes(b"\n".join(data.split(b"\n")[:lines]) + b"\n")
        bulk = d.dir / "bulk.log"
        bulk.write_bytes(data[:bulk_size])
        async with connect(d.socket, "bench-driver") as driver:
            sid = await driver.create_session(str(d.work), "wire", sandbox="danger-full-access")
            reader = StalledReader(d.socket, rcvbuf=1 << 20)
            try:
                await trio.to_thread.run_sync(reader.subscribe, sid)
                await trio.to_thread.run_sync(reader.read_batch, 10.0)  # its base batch
                out["line rate"] = await _wire_case(
                    driver, sid, reader, f'{PY} -c "{LINE_RATE_PROG}" {small}',
                    small.stat().st_size, lines * 0.01)
                out["bulk"] = await _wire_case(driver, sid, reader, f"cat {bulk}",
                                               bulk.stat().st_size, 0)
            finally:
                reader.close()
    return out


# ------------------------------------------------------------------------------ memory
#: Non-repeating output (every window turnover is a real change) at ~1.3 MB/s until the file
#: ``stop`` appears in the working directory: the lane turns the window over as often as the
#: daemon reads it, and the spill files stay small.
ENDLESS_SEQ = ("n=0; while [ ! -e stop ]; do seq $n $((n+20000)); n=$((n+20001)); sleep 0.1; "
               "done")


#: The memory bench's per-connection stream budget (``send_queue_stream_bytes``; default 4 MiB):
#: the lane of 8 such calls carries ~0.5 MB/s to a subscriber here, so a stall of a few seconds
#: fills 1 MiB, where the default would need ~10 s of it.
MEMORY_STREAM_BUDGET = 1024 * 1024


async def bench_memory(calls: int, stall: float, profile: Path | None) -> dict:
    """``calls`` calls stream ``ENDLESS_SEQ`` to 10 clients while one of them (a raw socket,
    small buffers) reads nothing for ``stall`` s: enough lane bytes that its stream budget
    fills, so its batches are dropped and it is rebased when it reads again."""
    stop = None
    with BenchDaemon({"send_queue_stream_bytes": MEMORY_STREAM_BUDGET}, profile=profile) as d:
        async with AsyncExitStack() as stack:
            driver = await stack.enter_async_context(connect(d.socket, "bench-driver"))
            sid = await driver.create_session(str(d.work), "memory", sandbox="danger-full-access")
            stalled = StalledReader(d.socket)
            stack.callback(stalled.close)
            await trio.to_thread.run_sync(stalled.subscribe, sid)
            await trio.to_thread.run_sync(stalled.read_batch, 10.0)  # its base batch
            watchers = await _watchers(d.socket, sid, 9, stack, "mem")
            stop = d.work / "stop"
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
                    cids = [await driver.run_tool(sid, ENDLESS_SEQ) for _ in range(calls)]
                    await trio.sleep(stall)  # the stalled client reads nothing meanwhile
                    stall_rss = d.rss_kib()
                    dropped_at_stall = (await driver.status())["droppedBatches"]
                    stop.touch()

                    def catch_up() -> None:
                        # Read again until the mirror shows every call settled: every batch
                        # must apply (a gap would raise); a dropped subscription gets a base.
                        while True:
                            if stalled.read_batch(60.0) is None:
                                raise AssertionError("the stalled client got nothing for 60 s")
                            v = stalled.mirror.value
                            if v is not None and not set(cids) & set(v["tools"]):
                                return

                    await trio.to_thread.run_sync(catch_up)
                    results = [await driver.wait(sid, cid) for cid in cids]
                    done = max([await w.wait_settled(cid) for w in watchers for cid in cids])
                for cid, result in zip(cids, results):
                    _check_window(watchers, cid, result)
                    if result["details"].get("spillPath"):
                        Path(result["details"]["spillPath"]).unlink()  # no writeback later
                elapsed = done - t0
                status = await driver.status()
                peak = d.peak_rss_kib()
                nursery.cancel_scope.cancel()
    total = sum(r["details"]["truncation"]["totalBytes"] for r in results)
    if not dropped_at_stall or stalled.bases < 2:
        raise AssertionError(
            f"the stalled client never reached its stream budget (dropped batches "
            f"{dropped_at_stall}, base batches {stalled.bases}; it read {stalled.bytes:,} B, the "
            f"calls wrote {total:,} B): drop-and-rebase did not run, "
            "so this bench measured nothing of it")
    return {"calls": calls, "output_bytes": total, "stall_s": stall, "idle_rss_kib": idle_rss,
            "peak_rss_kib": peak, "rss_after_stall_kib": stall_rss,
            "max_sampled_rss_kib": max(samples), "seconds": elapsed,
            "dropped_batches": status["droppedBatches"], "stalled_bases": stalled.bases,
            "stalled_batches": stalled.batches, "stalled_bytes": stalled.bytes,
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

    def med(which: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[which])

    none, stalled = med("none", "mbps_median"), med("stalled", "mbps_median")
    none_all = [x["mbps_median"] for x in runs["none"]]
    stalled_all = [x["mbps_median"] for x in runs["stalled"]]
    return {"subscribers": subscribers, "size": size, "rounds": rounds, "runs": runs,
            "none_mbps": none, "stalled_mbps": stalled, "ratio": stalled / none,
            # The stall's effect vs the run-to-run noise of each condition (range / median).
            "effect": stalled / none - 1,
            "noise": max((max(v) - min(v)) / statistics.median(v) for v in (none_all, stalled_all)),
            "none_slowest_mbps": med("none", "mbps_slowest"),
            "stalled_slowest_mbps": med("stalled", "mbps_slowest"),
            "dropped_batches": status.get("droppedBatches"), "profile": profile}


# ------------------------------------------------------------------------------ report
def _sizes(quick: bool) -> dict:
    if quick:
        return {"tp_size": 32 * MiB, "tp_rounds": 1, "lat_lines": 200, "wire_size": 256 * 1024, "wire_lines": 100,
                "mem_calls": 8, "stall": 4.0, "fan_subs": 50, "fan_size": 16 * MiB,
                "fan_rounds": 1, "micro_lines": 1000, "micro_seconds": 0.1}
    return {"tp_size": 256 * MiB, "tp_rounds": 3, "lat_lines": 1000, "wire_size": 4 * MiB, "wire_lines": 500,
            "mem_calls": 8, "stall": 10.0, "fan_subs": 200, "fan_size": 256 * MiB,
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
        lines = [f"throughput: {r['size'] // MiB} MiB per source, 3 clients with mirrors, median "
                 f"(min-max) of {r['rounds']} interleaved rounds; batches per client "
                 f"{r['client_batches']}"]
        for source, x in r["sources"].items():
            lines.append(
                f"  {source:6s}: baseline `CMD | tee SPILL | tail -c 51200` "
                f"{_spread(x['baseline_all'], 3)} s ({mb / x['baseline_s']:.0f} MB/s); dshd (run -> "
                f"3 mirrors settled) {_spread(x['ours_all'], 3)} s ({mb / x['ours_s']:.0f} MB/s), "
                f"daemon CPU {x['daemon_cpu_s']:.2f} s; ratio {_spread(x['ratios'], 2)}x")
            rows.append((f"throughput {source} (s)", f"{x['baseline_s']:.3f}", f"{x['ours_s']:.3f}",
                         f"{x['ratio']:.2f}x", "<= 1.2x", x["ratio"] <= 1.2))
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
        real = trio.run(bench_wire_real, z["wire_lines"], z["wire_size"])
        r = wire_efficiency(size=256 * 1024)
        real_lines = ["wire, real: bytes on the socket to one subscribed client per byte of output"]
        for case, x in real.items():
            real_lines.append(f"  {case:9s}: {x['output_bytes']:,} B of build log -> "
                              f"{x['wire_bytes']:,} B on the wire in {x['batches']} batches = "
                              f"{x['ratio']:.2f}x")
        rb, rl = real["bulk"], real["line rate"]
        rows.append(("real wire / output, bulk", f"{rb['output_bytes']:,}",
                     f"{rb['wire_bytes']:,}", f"{rb['ratio']:.2f}x", "<= 1.2x",
                     rb["ratio"] <= 1.2))
        rows.append(("real wire / output, 100 lines/s", f"{rl['output_bytes']:,}",
                     f"{rl['wire_bytes']:,}", f"{rl['ratio']:.2f}x", "(info)", None))
        c, cl = r["codec"], r["codec_line_rate"]
        lines = real_lines + [
                 f"wire, in-process replay (no daemon; the pipeline with chosen chunking): "
                 f"{r['output_bytes'] // 1024} KiB build log, 50 KB window, "
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
        rows.append(("replayed wire / output", f"{r['output_bytes']:,}", f"{r['wire_bytes']:,}",
                     f"{r['wire_ratio']:.3f}x", "(info)", None))
        rows.append(("wire vs snapshot/flush", f"{r['snapshot_bytes']:,}", f"{r['wire_bytes']:,}",
                     f"{r['wire_bytes'] / r['snapshot_bytes']:.2f}x", "(info)", None))
        rows.append(("codec savings, hot path", f"{cl['inline_bytes']:,}", f"{cl['wire_bytes']:,}",
                     f"{cl['savings']:.1%}", ">= 33%", cl["savings"] >= 0.33))
        rows.append(("codec savings, 20 flushes", f"{c['inline_bytes']:,}", f"{c['wire_bytes']:,}",
                     f"{c['savings']:.1%} ({c['structure_savings']:.0%} non-payload)", "(info)",
                     None))
    elif name == "memory":
        r = trio.run(bench_memory, z["mem_calls"], z["stall"], prof)
        lines = [f"memory: {r['calls']} calls of endless `seq` ({r['output_bytes'] / 1e6:.0f} MB "
                 f"in all) to 10 clients, one stalled {r['stall_s']:g} s ({r['seconds']:.1f} s run)",
                 f"  baseline: daemon RSS with 10 clients attached, idle: "
                 f"{r['idle_rss_kib'] / 1024:.1f} MiB",
                 f"  peak RSS (VmHWM) {r['peak_rss_kib'] / 1024:.1f} MiB, sampled max "
                 f"{r['max_sampled_rss_kib'] / 1024:.1f} MiB, at stall end "
                 f"{r['rss_after_stall_kib'] / 1024:.1f} MiB",
                 f"  the stalled client reached its budget (send_queue_stream_bytes = "
                 f"{MEMORY_STREAM_BUDGET // MiB} MiB): {r['dropped_batches']} batches "
                 f"dropped, healed by {r['stalled_bases'] - 1} rebase(s) ({r['stalled_bases']} "
                 f"base batches in {r['stalled_batches']}, {r['stalled_bytes'] / 1e6:.1f} MB read)"]
        ratio = r["peak_rss_kib"] / r["idle_rss_kib"]
        rows.append(("memory peak RSS (MiB)", f"{r['idle_rss_kib'] / 1024:.1f}",
                     f"{r['peak_rss_kib'] / 1024:.1f}", f"{ratio:.2f}x", "<= 100 MB",
                     r["peak_rss_kib"] * 1024 <= 100e6))
    elif name == "fanout":
        r = trio.run(bench_fanout, z["fan_subs"], z["fan_size"], z["fan_rounds"], prof)
        lines = [f"fan-out: {r['subscribers']} subscribers, {r['size'] // MiB} MiB of `seq`, "
                 f"{r['rounds']} runs each, interleaved (MB/s of output reaching the fast mirrors)"]
        for which in ("none", "stalled"):
            for x in r["runs"][which]:
                lines.append(f"  {which:7s}: command {x['cmd_s']:.2f} s; fast mirrors settled "
                             f"median {x['median_s']:.2f} s ({x['mbps_median']:.0f} MB/s), "
                             f"slowest {x['max_s']:.2f} s ({x['mbps_slowest']:.0f} MB/s)")
        verdict = ("within the noise: no measurable effect" if abs(r["effect"]) <= r["noise"]
                   else "larger than the noise")
        lines.append(f"  medians: none {r['none_mbps']:.0f} MB/s, stalled {r['stalled_mbps']:.0f} "
                     f"MB/s; ratio stalled/none {r['ratio']:.2f} (target >= 0.80); slowest "
                     f"{r['stalled_slowest_mbps'] / r['none_slowest_mbps']:.2f}; dropped batches "
                     f"{r['dropped_batches']}")
        lines.append(f"  effect of the stalled subscriber {r['effect']:+.1%} vs run-to-run noise "
                     f"{r['noise']:.1%} (largest min-max range / median of either condition): "
                     f"{verdict}")
        rows.append(("fan-out fast MB/s", f"{r['none_mbps']:.0f}", f"{r['stalled_mbps']:.0f}",
                     f"{r['ratio']:.2f}", ">= 0.80", r["ratio"] >= 0.8))
    elif name == "micro":
        r = microbench(lines=z["micro_lines"], min_seconds=z["micro_seconds"])
        rt = r["rates"]
        lines = [f"micro: rolling-window line-rate stream, {r['batches']} batches, "
                 f"{r['ops_per_batch']:.1f} ops/batch, 50 KB window",
                 "  ops/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in rt.items()),
                 f"  per batch: produce (the tracker's diff, {r['produce_us_per_batch']:.1f} us)"
                 f"+encode+decode+apply {r['us_per_batch']:.1f} us vs snapshot "
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
