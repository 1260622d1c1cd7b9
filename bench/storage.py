"""Storage bench: opening (repairing) long session logs, and listing many sessions (issue 14).

Theory of operation: in one state directory (under /tmp, on the file system under test) the
bench builds, with the real writer (`SessionLog`, snapshot every 10,000 events, a flush every
2,000 events: not one fsync per event), session logs of 10k, 100k and 1M events in a realistic
mix (a turn = turn/start, message/user, step/start, message/assistant naming a tool call,
tool/call, tool/result with ~400 bytes of build-log-like output, step/end, a closing
message/assistant, turn/end), plus a 100k log written without snapshots (an old log: the
"before" path, read whole), a log of the largest size with ~a quarter of its events tool
calls (3 a turn: ~250k calls in 1M events) whose snapshots carry the real session dict
(``Session.snapshot_state``: its call index delta; the build prints each log's snapshot
bytes), and enough small sessions (written with the format encoder: a
header frame, a few events, a snapshot, summary.json) to make 10,000 sessions in all.

1. **open**: a fresh child process opens each log for writing with repair
   (`SessionLog.open_for_write(repair=True)`) and reports the wall time of the open and its
   RSS after it (VmRSS) next to its RSS before (imports); for the calls log also the
   session's call index from its snapshot chain (``dshd.sessions.chain.read_index``). ≥ 3 interleaved rounds; median,
   min–max. Goal: the 1M log ≤ 2 s and ≤ 100 MB.
2. **list (storage)**: a fresh child runs `summary.read_summary` over every session directory
   (what ``session.list`` does for closed sessions) and reports the wall time and the bytes it
   read (``rchar`` of /proc/self/io); the baseline is ``ls`` + ``cat`` of every summary.json
   in the same round.
3. **list (daemon)**: a real ``dshd`` (`BenchDaemon`) on that state directory answers
   ``session.list`` to the real client library over its socket; wall per call and the bytes
   the daemon read (its /proc/PID/io ``rchar``). Goal ≤ 0.3 s and no full log read. Measured
   only when the registry lists from summaries (room sessions' change); otherwise it says so.

Nothing asserts on time. ``--quick`` uses small sizes (the smoke test).
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
import zstandard

from dshd.storage import Header, SessionLog
from dshd.storage.format import encode_line, encode_trailer, new_event
from dshd.storage.repair import RepairState
from dshd.storage.snapshot import EMPTY_SETTINGS, fold_settings, snapshot_data
from dshd.storage.summary import summary_dict, write_summary

from .dshd_proc import ROOT, BenchDaemon

OPEN_GOAL_S, OPEN_GOAL_MB, LIST_GOAL_S = 2.0, 100.0, 0.3
_WARN = ["unused variable ‘x’", "implicit fallthrough", "comparison of distinct pointer types",
         "‘buf’ may be used uninitialized", "format ‘%d’ expects ‘int’"]


def _output(i: int) -> str:
    """~400 bytes of build-log-like output, different for every call."""
    return "\n".join(
        f"[{(i * 7 + k) % 400:3d}/400] cc -O2 -c src/m{(i * 31 + k) % 1009}.c  "
        f"warning: {_WARN[(i + k) % 5]} [{i * 13 + k}]" for k in range(5))


def _turn(i: int) -> list[tuple[str, dict]]:
    """One turn's events (9): the realistic mix of the module doc."""
    t, s, c = f"t{i}", f"s{i}", f"call-{i}"
    args = json.dumps({"command": f"make -j4 target_{i % 97}"})
    return [
        ("turn/start", {"turnId": t}),
        ("message/user", {"turnId": t, "text": f"build target {i % 97} and tell me what broke"}),
        ("step/start", {"turnId": t, "stepId": s}),
        ("message/assistant", {"turnId": t, "stepId": s, "text": "",
                               "toolCalls": [{"callId": c, "name": "bash", "arguments": args}]}),
        ("tool/call", {"callId": c, "name": "bash", "arguments": args, "turnId": t,
                       "stepId": s}),
        ("tool/result", {"callId": c, "isError": False, "content": _output(i),
                         "details": {"exitCode": 0}, "exitCode": 0}),
        ("step/end", {"turnId": t, "stepId": s}),
        ("message/assistant", {"turnId": t, "text": f"target {i % 97} builds; 5 warnings"}),
        ("turn/end", {"turnId": t, "reason": "completed"}),
    ]


def _calls_turn(i: int, k: int = 3) -> list[tuple[str, dict]]:
    """One turn with ``k`` tool calls (6 + 2k events): ~250k calls in 1M events at k = 3."""
    t, s = f"t{i}", f"s{i}"
    ids = [f"m-{(i * k + j) * 2654435761 % 2**64:016x}" for j in range(k)]
    args = json.dumps({"command": f"make -j4 target_{i % 97}"})
    out: list[tuple[str, dict]] = [
        ("turn/start", {"turnId": t}), ("message/user", {"turnId": t, "text": f"build {i}"}),
        ("step/start", {"turnId": t, "stepId": s}),
        ("message/assistant", {"turnId": t, "stepId": s, "text": "", "toolCalls": [
            {"callId": c, "name": "bash", "arguments": args} for c in ids]})]
    for j, c in enumerate(ids):
        out.append(("tool/call", {"callId": c, "name": "bash", "arguments": args,
                                  "turnId": t, "stepId": s}))
        out.append(("tool/result", {"callId": c, "isError": False, "content": _output(i + j),
                                    "details": {"exitCode": 0}, "exitCode": 0}))
    return out + [("step/end", {"turnId": t, "stepId": s}),
                  ("message/assistant", {"turnId": t, "text": "done"}),
                  ("turn/end", {"turnId": t, "reason": "completed"})]


async def _build_calls(state_dir: Path, sid: str, n_events: int) -> None:
    """A log of ``n_events`` with ~n/4 tool calls whose snapshots carry the real session's
    dict (``Session.snapshot_state`` on a stand-in holding a real ``CallIndex``)."""
    from types import SimpleNamespace as NS

    from dshd.sessions.call_index import CallIndex
    from dshd.sessions.session import Session

    header = Header(id=sid, createdAt=1_700_000_000_000, cwd="/srv/bench", title=sid)
    log = SessionLog.create(state_dir, sid, header, snapshot_every=10_000)
    index = CallIndex()
    owner = NS(_log=log, _calls=NS(known=NS(index=index)), _approvals=NS(decided={}),
               _lane=NS(tracker=NS(value={"recent": []})), _logged_env={})
    log.set_snapshot_state(lambda: Session.snapshot_state(owner))
    i = 0
    while log.last_seq + 1 < n_events:
        for type_, data in _calls_turn(i):
            seq = log.append(type_, data).seq
            if type_ == "tool/call":
                index.add(data["callId"])
            elif type_ == "tool/result":
                index.settle(data["callId"], seq)
        i += 1
        if i % 160 == 0:  # ~2,000 events per flush
            await log.flush()
    await log.aclose()


def snapshot_bytes(path: Path) -> tuple[int, int]:
    """(bytes of the snapshot frames with their trailers, how many), walking back over the
    trailers of a zstd log (decompressing only each frame's first bytes)."""
    dctx = zstandard.ZstdDecompressor()
    with open(path, "rb") as f:
        data = f.read()
    pos, total, n = len(data), 0, 0
    while pos > 16:
        start = pos - 16 - int.from_bytes(data[pos - 8: pos - 4], "little")
        if start <= 0:
            break
        with dctx.stream_reader(data[start: pos - 16]) as r:
            if b'"type":"log/snapshot"' in r.read(200):
                total, n = total + pos - start, n + 1
        pos = start
    return total, n


async def _build(state_dir: Path, sid: str, n_events: int, every: int) -> None:
    """A log of ``n_events`` through the real writer. The last ``min(5000, n/4)`` events come
    after the last snapshot (no snapshot at close: as after a crash), so an open has a real
    tail to verify and keep."""
    header = Header(id=sid, createdAt=1_700_000_000_000, cwd="/srv/bench", title=sid)
    turns = {"n": 0}
    log = SessionLog.create(state_dir, sid, header, snapshot_every=every,
                            snapshot_state=lambda: {"turns": turns["n"]})
    log.append("session/owner", {"uid": os.getuid()}, ignorable=True)
    tail_from = n_events - min(5_000, n_events // 4)
    i = 0
    while log.last_seq + 1 < n_events:
        for type_, data in _turn(i):
            log.append(type_, data)
        turns["n"] = i = i + 1
        if i % 222 == 0:  # ~2,000 events per flush
            await log.flush()
        if log.last_seq >= tail_from:
            log.set_snapshot_state(None)
    await log.aclose()


def _small_session(sessions: Path, sid: str, cctx) -> None:
    """A small closed session written with the format encoder (module doc)."""
    d = sessions / sid
    d.mkdir(mode=0o700)
    header = Header(id=sid, createdAt=1_700_000_000_000, cwd="/srv/small", title=sid)
    events = [new_event(k, t, dt, time_ms=1_700_000_000_001)[0]
              for k, (t, dt) in enumerate([("approval/policy", {"policy": "never",
                                                                "source": "config"}),
                                           *_turn(0)])]
    frames = [encode_line(header), b"".join(encode_line(e) for e in events)]
    blob = b"".join(f + encode_trailer(f) for f in (cctx.compress(p) for p in frames))
    settings = dict(EMPTY_SETTINGS)
    for e in events:
        settings = fold_settings(settings, e)
    snap = snapshot_data(through=len(events) - 1, offset=len(blob), prev=None,
                         repair=RepairState().see_all(events), settings=settings,
                         session={"turns": 1})
    line = encode_line(new_event(len(events), "log/snapshot", snap, ignorable=True,
                                 time_ms=1_700_000_000_002)[0])
    frame = cctx.compress(line)
    offset = len(blob)
    blob += frame + encode_trailer(frame)
    (d / "session.v1.jsonl.zst").write_bytes(blob)
    os.chmod(d / "session.v1.jsonl.zst", 0o600)
    write_summary(d, summary_dict(header, settings, len(events), len(blob), offset))


def build_state(state_dir: Path, sizes: list[int], sessions: int) -> dict[str, int]:
    """Every session of the bench; returns {session id: events} of the built long logs."""
    long_logs = {f"open-{n}": n for n in sizes}
    old = max(s for s in sizes if s <= 100_000) if any(s <= 100_000 for s in sizes) else sizes[0]
    long_logs[f"old-{old}"] = old
    long_logs[f"calls-{max(sizes)}"] = max(sizes)
    for sid, n in long_logs.items():
        t0 = time.monotonic()
        if sid.startswith("calls-"):
            trio.run(_build_calls, state_dir, sid, n)
        else:
            trio.run(_build, state_dir, sid, n, 0 if sid.startswith("old-") else 10_000)
        path = state_dir / "sessions" / sid / "session.v1.jsonl.zst"
        snaps, count = snapshot_bytes(path)
        print(f"  built {sid}: {n:,} events, {path.stat().st_size / 2**20:.1f} MiB in "
              f"{time.monotonic() - t0:.1f} s; {count} snapshots, {snaps / 2**20:.2f} MiB of "
              "them", flush=True)
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
    for k in range(max(0, sessions - len(long_logs))):
        _small_session(state_dir / "sessions", f"small-{k:05d}", cctx)
    return long_logs


_OPEN_CHILD = r"""
import json, sys, time, trio
from pathlib import Path
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
from dshd.storage import SessionLog
before = rss()
async def main():
    t0 = time.perf_counter()
    log = await SessionLog.open_for_write(Path(sys.argv[1]), sys.argv[2], repair=True)
    known = None
    if sys.argv[2].startswith("calls-"):  # the session's call index too (what an open needs)
        try:
            from dshd.sessions.chain import read_index
            index = read_index(log.session_dir, log.session_id, log.snapshot_offset,
                               log.snapshot_seq, log.durable_bytes)
        except ImportError:  # before the snapshot chain: the whole index in the last one
            from dshd.sessions.logview import restore
            index = restore(log.snapshot)[1]
        known = len(index)
    wall = time.perf_counter() - t0
    after = rss()
    out = {"wall": wall, "rss_before": before, "rss_after": after, "tail": len(log.tail),
           "last_seq": log.last_seq, "known": known}
    await log.aclose()
    return out
print(json.dumps(trio.run(main)))
"""

_LIST_CHILD = r"""
import json, sys, time
from pathlib import Path
from dshd.storage.reader import list_session_dirs
from dshd.storage.summary import read_summary
def rchar():
    for line in open('/proc/self/io'):
        if line.startswith('rchar:'):
            return int(line.split()[1])
state = Path(sys.argv[1]); defaults = {"approvalPolicy": "ask", "sandbox": "workspace-write",
                                       "owner": None}
r0 = rchar(); t0 = time.perf_counter()
ids = list_session_dirs(state)
rows = [read_summary(state / "sessions" / i, i, defaults) for i in ids]
wall = time.perf_counter() - t0
print(json.dumps({"wall": wall, "rchar": rchar() - r0, "n": len(rows),
                  "last": max(r.lastSeq for r in rows)}))
"""


def _child(code: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"bench child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def _spread(xs: list[float], fmt: str = "{:.3f}") -> str:
    return (f"median {fmt.format(statistics.median(xs))} "
            f"(min {fmt.format(min(xs))} – max {fmt.format(max(xs))}, n={len(xs)})")


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def bench_open(state_dir: Path, long_logs: dict[str, int], rounds: int) -> None:
    print("\n== open for write + repair (fresh process each) ==")
    results: dict[str, list[dict]] = {sid: [] for sid in long_logs}
    order = list(long_logs)
    for r in range(rounds):
        for sid in order[r % len(order):] + order[: r % len(order)]:  # rotate: interleaved
            results[sid].append(_child(_OPEN_CHILD, str(state_dir), sid))
    for sid, runs in results.items():
        walls = [x["wall"] for x in runs]
        rss = [x["rss_after"] for x in runs]
        print(f"  {sid:>14} ({long_logs[sid]:>9,} events): open {_spread(walls)} s; RSS after "
              f"open {_spread(rss, '{:.1f}')} MB (before open {runs[0]['rss_before']:.1f} MB); "
              f"tail kept {runs[0]['tail']:,} events"
              + (f"; call index {runs[0]['known']:,} calls" if runs[0]["known"] else ""))
    biggest = max((s for s in long_logs if s.startswith("open-")), key=long_logs.get)
    biggest = next((s for s in long_logs if s.startswith("calls-")), biggest)
    walls = [x["wall"] for x in results[biggest]]
    rss = [x["rss_after"] for x in results[biggest]]
    ten_k = [s for s in long_logs if s.startswith("open-")]
    base = min(ten_k, key=long_logs.get)
    ratio = statistics.median(walls) / statistics.median([x["wall"] for x in results[base]])
    print(f"  {biggest} vs {base}: {ratio:.2f}× the open wall for "
          f"{long_logs[biggest] / long_logs[base]:.0f}× the events")
    print(f"  goal open ≤ {OPEN_GOAL_S} s: {_verdict(statistics.median(walls) <= OPEN_GOAL_S)}; "
          f"RSS ≤ {OPEN_GOAL_MB:.0f} MB: {_verdict(statistics.median(rss) <= OPEN_GOAL_MB)} "
          f"({biggest})")


def _baseline_ls_cat(state_dir: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", 'ls "$1" >/dev/null && cat "$1"/*/summary.json >/dev/null',
                    "sh", str(state_dir / "sessions")], check=True)
    return time.perf_counter() - t0


def bench_list_storage(state_dir: Path, rounds: int) -> None:
    print("\n== list: summary.read_summary over every session (fresh process each) ==")
    walls, bases, reads, n = [], [], [], 0
    for _ in range(rounds):
        out = _child(_LIST_CHILD, str(state_dir))
        walls.append(out["wall"])
        reads.append(out["rchar"])
        n = out["n"]
        bases.append(_baseline_ls_cat(state_dir))
    logs = sum(p.stat().st_size for p in (state_dir / "sessions").glob("*/session.v1.jsonl.zst"))
    print(f"  {n:,} sessions: {_spread(walls)} s; baseline ls + cat of the summaries "
          f"{_spread(bases)} s; ratio {statistics.median(walls) / statistics.median(bases):.1f}×")
    print(f"  bytes read: {statistics.median(reads) / 2**20:.1f} MiB (all logs together: "
          f"{logs / 2**20:.1f} MiB)")
    print(f"  goal ≤ {LIST_GOAL_S} s (storage part of session.list): "
          f"{_verdict(statistics.median(walls) <= LIST_GOAL_S)}")


def _rchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


async def _list_calls(daemon: BenchDaemon, rounds: int) -> list[tuple[float, int, int]]:
    from client.api import connect

    out = []
    async with connect(daemon.socket, "bench-storage") as client:
        for _ in range(rounds + 1):  # the first call fills the registry's cache
            r0, t0 = _rchar(daemon.pid), time.perf_counter()
            rows = await client.list_sessions()
            out.append((time.perf_counter() - t0, _rchar(daemon.pid) - r0, len(rows)))
    return out


def bench_list_daemon(daemon: BenchDaemon, rounds: int, force: bool) -> None:
    print("\n== session.list through a real dshd (real socket, real client) ==")
    registry = (ROOT / "dshd" / "sessions" / "registry.py").read_text(encoding="utf-8")
    if "read_summary" not in registry and not force:
        print("  NOT measured: dshd/sessions/registry.py still reads whole logs for closed "
              "sessions (room sessions' change is not merged); --force-daemon-list runs it "
              "anyway")
        return
    with daemon:
        calls = trio.run(_list_calls, daemon, rounds)
    first, rest = calls[0], calls[1:]
    print(f"  first call (cold cache): {first[0]:.3f} s, daemon read {first[1] / 2**20:.1f} MiB, "
          f"{first[2]:,} sessions")
    print(f"  later calls: {_spread([c[0] for c in rest])} s, daemon read "
          f"{statistics.median([c[1] for c in rest]) / 2**20:.2f} MiB each")
    print(f"  goal ≤ {LIST_GOAL_S} s: first {_verdict(first[0] <= LIST_GOAL_S)}, later "
          f"{_verdict(statistics.median([c[0] for c in rest]) <= LIST_GOAL_S)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench storage", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sessions", type=int, default=None)
    p.add_argument("--force-daemon-list", action="store_true")
    args = p.parse_args(argv)
    sizes = [2_000, 20_000] if args.quick else [10_000, 100_000, 1_000_000]
    sessions = args.sessions or (300 if args.quick else 10_000)
    rounds = max(3, args.rounds)
    daemon = BenchDaemon(prefix="dsb-storage-")  # not started: the state is built first
    try:
        state = daemon.state_dir
        print(f"storage bench: sizes {sizes}, {sessions:,} sessions, {rounds} rounds")
        long_logs = build_state(state, sizes, sessions)
        bench_open(state, long_logs, rounds)
        bench_list_storage(state, rounds)
        bench_list_daemon(daemon, rounds, args.force_daemon_list)
    finally:
        daemon.stop()  # idempotent: ends the daemon (if started) and removes the directory
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
