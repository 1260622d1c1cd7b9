"""Request-path bench (issue 14): daemon CPU per request and per call, fsyncs per call, durable
events/s across sessions, and the CLI's start -- each next to a baseline measured in the same run.

Theory of operation: one real ``dshd`` (``bench.dshd_proc.BenchDaemon``), the real client
library over the real socket, real call hosts. Every figure is the median of ``--rounds``
interleaved rounds (min–max beside it), never a best-of; nothing asserts on time.

* **status**: ``daemon.status`` ``N`` times on one connection; the daemon's CPU
  (``/proc/PID/stat`` utime+stime) per request. Baselines: a bare trio line server in a
  subprocess (``receive_some`` + ``send_all`` of a fixed answer: the event loop's and the
  kernel's floor, which on a VM is most of it), the daemon's idle CPU over the same wall
  time, and the floor of the work itself in this process (``msgspec`` decode of the request
  line + encode of the answer).
* **call**: ``tool.run`` of ``true`` (pre-approved, ``danger-full-access``) + ``tool.wait``,
  ``N`` times; the daemon's own CPU per call, and beside it the call host's: this process is
  the hosts' child subreaper (``PR_SET_CHILD_SUBREAPER``), so a host that double-forked out of
  the daemon is reparented here and reaped with ``wait4`` (its rusage, its command's
  included); the intermediate the daemon reaps shows in the daemon's ``cutime``/``cstime``.
* **fsyncs**: ``strace -f -y -e trace=fsync,fdatasync`` attached to the daemon while it runs
  ``K`` calls and ``K`` ``daemon.status``: fsyncs per call and per request, by file (the
  session log; the call host's own files, since ``-f`` follows the hosts the daemon starts).
* **durable**: 16 sessions × 4 clients (one connection each) each change their session's
  approval policy in a loop (each answer means one event is durable: the daemon answers after
  its flush) for ``--seconds``; events/s. Baseline in the same round: bare ``os.write`` +
  ``os.fsync`` of one event-sized chunk, 16 files × 4 threads (the same thread count), one
  chunk per fsync. Fsyncs per event of the daemon are counted under ``strace`` in a separate
  short run (strace slows the daemon; its events/s there is not the figure). The daemon's
  CPU per event is printed beside its rate.
* **cli**: client CPU (``getrusage(RUSAGE_CHILDREN)``, user+sys) of ``dsh --version`` and
  ``dsh run -- true`` (against the bench daemon) over ``--cli-runs`` runs each, interleaved
  with the baselines ``python3 -c pass`` and ``python3 -c "import trio"``.

``--quick``: small counts, one round (a smoke run, < 30 s).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import trio

from bench.dshd_proc import BenchDaemon
from client.api import connect

GOALS = {
    "status_us": 100.0,  # daemon CPU per daemon.status, µs
    "call_ms": 1.5,  # daemon CPU per `true` call end to end, ms
    "durable_ratio": 0.5,  # durable events/s vs bare write+fsync, same thread count
    "version_ms": 60.0,  # dsh --version client CPU
    "run_ms": 120.0,  # dsh run -- true client CPU
}
CONFIG = {"sandbox": "danger-full-access"}
SESSIONS, CLIENTS = 16, 4
_PR_SET_CHILD_SUBREAPER = 36


# ------------------------------------------------------------------ helpers
def _proc_cpu(pid: int) -> tuple[float, float]:
    """(own utime+stime, waited-for children's cutime+cstime) of ``pid``, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _spread(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "n/a"
    med = statistics.median(values)
    return f"{fmt.format(med)} (min {fmt.format(min(values))}, max {fmt.format(max(values))})"


def _verdict(value: float, goal: float, *, higher: bool = False) -> str:
    ok = value >= goal if higher else value <= goal
    return f"goal {'≥' if higher else '≤'} {goal:g}: {'met' if ok else 'NOT met'}"


class Reaper:
    """Make this process the child subreaper of its descendants, and reap the orphans (call
    hosts) that are not ``keep`` (the daemon, whose ``Popen`` reaps it), summing their CPU."""

    def __init__(self, keep: set[int]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        self.keep = keep
        self.cpu = 0.0
        self.reaped = 0

    def reap(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in self.keep:
                return  # nothing exited, or only the daemon (left to its Popen)
            _, _, ru = os.wait4(info.si_pid, 0)
            self.cpu += ru.ru_utime + ru.ru_stime
            self.reaped += 1


# ------------------------------------------------------------------ status and calls
async def _status_round(sock: Path, pid: int, n: int) -> dict:
    async with connect(sock, "bench-requests") as c:
        await c.status()  # warm
        cpu0, t0 = _proc_cpu(pid)[0], time.perf_counter()
        for _ in range(n):
            await c.status()
        cpu1, wall = _proc_cpu(pid)[0], time.perf_counter() - t0
    # Baseline: the daemon doing nothing for the same wall time.
    idle0 = _proc_cpu(pid)[0]
    await trio.sleep(wall)
    idle = _proc_cpu(pid)[0] - idle0
    return {"us": (cpu1 - cpu0) / n * 1e6, "idle_us": idle / n * 1e6, "per_s": n / wall}


async def _echo_serve(path: str) -> None:
    """A bare trio line server on ``path``: one fixed answer per line (the status baseline)."""
    answer = b'{"jsonrpc":"2.0","id":1,"result":{}}\n'

    async def handler(stream: trio.SocketStream) -> None:
        buf = b""
        while data := await stream.receive_some(65536):
            buf += data
            while b"\n" in buf:
                _, _, buf = buf.partition(b"\n")
                await stream.send_all(answer)

    sock = trio.socket.socket(trio.socket.AF_UNIX)
    await sock.bind(path)
    sock.listen()
    await trio.serve_listeners(handler, [trio.SocketListener(sock)])


def _echo_round(n: int) -> float:
    """Server CPU per request of :func:`_echo_serve` in a subprocess, over a blocking client."""
    path = tempfile.mktemp(prefix="dsb-echo-", dir="/tmp")
    server = subprocess.Popen([sys.executable, "-m", "bench.requests", "--echo-server", path])
    try:
        deadline = time.monotonic() + 20
        with socket.socket(socket.AF_UNIX) as c:
            while True:  # the path exists from bind(), connects work from listen()
                try:
                    c.connect(path)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError("the echo server did not start") from None
                    time.sleep(0.02)
            f = c.makefile("rb")
            line = b'{"jsonrpc":"2.0","id":1,"method":"daemon.status","params":{}}\n'
            c.sendall(line)
            f.readline()
            cpu0 = _proc_cpu(server.pid)[0]
            for _ in range(n):
                c.sendall(line)
                f.readline()
            return (_proc_cpu(server.pid)[0] - cpu0) / n * 1e6
    finally:
        server.kill()
        server.wait()
        if os.path.exists(path):
            os.unlink(path)


def _floor_us(n: int = 20000) -> float:
    """This process: decode a daemon.status request line + encode an answer of its size."""
    line = b'{"jsonrpc":"2.0","id":7,"method":"daemon.status","params":{}}\n'
    answer = {"jsonrpc": "2.0", "id": 7, "result": {"version": "0.1.0", "pid": 1, "startedAt": 1,
              "sessionsOpen": 1, "connections": 1, "subscriptions": 0, "droppedBatches": 0,
              "sandbox": {"provider": "bwrap", "completeness": "full"}, "stateDir": "/tmp/x"}}
    enc, dec = msgspec.json.Encoder(), msgspec.json.Decoder()
    t0 = time.process_time()
    for _ in range(n):
        dec.decode(line)
        enc.encode(answer)
    return (time.process_time() - t0) / n * 1e6


async def _call_round(sock: Path, pid: int, reaper: Reaper, session: str, n: int) -> dict:
    async with connect(sock, "bench-requests") as c:
        reaper.reap()
        (own0, kids0), host0 = _proc_cpu(pid), reaper.cpu
        t0 = time.perf_counter()
        for _ in range(n):
            call_id = await c.run_tool(session, "true")
            result = await c.wait(session, call_id)
            if result.exit_code != 0:
                raise RuntimeError(f"`true` ended {result.exit_code}: {result}")
        wall = time.perf_counter() - t0
        await trio.sleep(0.2)  # the last host's exit
        reaper.reap()
        own1, kids1 = _proc_cpu(pid)
    return {"ms": (own1 - own0) / n * 1e3, "start_ms": (kids1 - kids0) / n * 1e3,
            "host_ms": (reaper.cpu - host0) / n * 1e3, "per_s": n / wall}


async def _new_session(sock: Path, cwd: Path) -> str:
    async with connect(sock, "bench-requests") as c:
        return await c.create_session(cwd, "bench", approval_policy="never")


def _strace_counts(pid: int, work) -> tuple[dict[str, int], object]:
    """Run ``work()`` with strace tracing the fsync/fdatasync calls of the daemon and of what
    it starts (``-f``: the call hosts); counted by the file's kind (``-y`` names the fd's path):
    ``log`` (a session log), ``host`` (a call's files: output.raw, exit.json, its directory),
    ``other``."""
    out = Path(tempfile.mkstemp(prefix="dsb-strace-")[1])
    tracer = subprocess.Popen(["strace", "-f", "-y", "-e", "trace=fsync,fdatasync", "-o", str(out),
                               "-p", str(pid)], stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # attached (all threads)
    try:
        result = work()
    finally:
        tracer.terminate()
        tracer.wait(10)
    text = out.read_text()
    out.unlink()
    counts = {"log": 0, "host": 0, "other": 0}
    for m in re.finditer(r"f(?:data)?sync\(\d+<([^>]*)>", text):
        path = m.group(1)
        kind = "log" if ".jsonl" in path else "host" if "/calls/" in path else "other"
        counts[kind] += 1
    return counts, result


# ------------------------------------------------------------------ durable events/s
async def _durable_round(sock: Path, pid: int, sessions: list[str], seconds: float) -> dict:
    count = 0
    policies = ("ask", "never")

    async def client(session: str, k: int) -> None:
        nonlocal count
        async with connect(sock, "bench-durable") as c:
            i = k
            while trio.current_time() < end:
                await c.set_policy(session, policies[i % 2])
                i += 1
                count += 1

    end = trio.current_time() + seconds
    t0, cpu0 = time.perf_counter(), _proc_cpu(pid)[0]
    async with trio.open_nursery() as nursery:
        for s in sessions:
            for k in range(CLIENTS):
                nursery.start_soon(client, s, k)
    cpu = _proc_cpu(pid)[0] - cpu0
    return {"events": count, "per_s": count / (time.perf_counter() - t0),
            "cpu_us": cpu / max(count, 1) * 1e6}


def _bare_round(base: Path, files: int, threads_per_file: int, seconds: float, chunk: int) -> dict:
    """``files`` × ``threads_per_file`` threads, each ``os.write`` + ``os.fsync`` of one chunk."""
    data = os.urandom(chunk)
    counts = [0] * (files * threads_per_file)
    fds = [os.open(base / f"bare-{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
           for i in range(files)]
    end = time.perf_counter() + seconds

    def work(k: int) -> None:
        fd = fds[k // threads_per_file]
        while time.perf_counter() < end:
            os.write(fd, data)
            os.fsync(fd)
            counts[k] += 1

    t0 = time.perf_counter()
    workers = [threading.Thread(target=work, args=(k,)) for k in range(len(counts))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    for fd in fds:
        os.close(fd)
    for i in range(files):
        (base / f"bare-{i}.bin").unlink()
    return {"writes": sum(counts), "per_s": sum(counts) / wall}


# ------------------------------------------------------------------ CLI start
def _child_cpu_ms(argv: list[str], env: dict) -> float:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000


def _cli_runs(sock: Path, runs: int) -> dict[str, list[float]]:
    dsh = Path(sys.executable).with_name("dsh")
    env = dict(os.environ, DSH_SOCKET=str(sock))
    cases = {
        "python3 -c pass": [sys.executable, "-c", "pass"],
        'python3 -c "import trio"': [sys.executable, "-c", "import trio"],
        "dsh --version": [str(dsh), "--version"],
        "dsh run -- true": [str(dsh), "run", "--", "true"],
    }
    out: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):  # interleaved: drift weighs on every case alike
        for name, argv in cases.items():
            out[name].append(_child_cpu_ms(argv, env))
    return out


# ------------------------------------------------------------------ the run
async def _measure(d: BenchDaemon, reaper: Reaper, args) -> dict:
    sock, pid = d.socket, d.pid
    assert pid is not None
    session = await _new_session(sock, d.work)
    durable_sessions = [await _new_session(sock, d.work) for _ in range(SESSIONS)]
    r: dict[str, list] = {k: [] for k in ("status", "echo", "call", "durable", "bare")}
    tmp = Path(tempfile.mkdtemp(prefix="dsb-bare-", dir=d.dir))
    await _call_round(sock, pid, reaper, session, 3)  # warm: first host, first flushes
    for _ in range(args.rounds):
        r["status"].append(await _status_round(sock, pid, args.requests))
        r["echo"].append(await trio.to_thread.run_sync(_echo_round, args.requests))
        r["call"].append(await _call_round(sock, pid, reaper, session, args.calls))
        r["durable"].append(await _durable_round(sock, pid, durable_sessions, args.seconds))
        r["bare"].append(await trio.to_thread.run_sync(
            _bare_round, tmp, SESSIONS, CLIENTS, args.seconds, args.chunk))
    return r


def _fsync_phase(d: BenchDaemon, reaper: Reaper, k: int, seconds: float) -> dict:
    sock, pid = d.socket, d.pid
    session = trio.run(_new_session, sock, d.work)
    sessions = [trio.run(_new_session, sock, d.work) for _ in range(SESSIONS)]
    calls, _ = _strace_counts(pid, lambda: trio.run(_call_round, sock, pid, reaper, session, k))
    status, _ = _strace_counts(pid, lambda: trio.run(_status_round, sock, pid, k))
    durable, res = _strace_counts(pid, lambda: trio.run(_durable_round, sock, pid, sessions, seconds))
    return {"log_per_call": calls["log"] / k, "host_per_call": calls["host"] / k,
            "other_per_call": calls["other"] / k, "per_status": sum(status.values()) / k,
            "per_event": durable["log"] / max(res["events"], 1), "events": res["events"]}


def report(r: dict, fs: dict | None, cli: dict[str, list[float]], floor: float) -> str:
    st = [x["us"] for x in r["status"]]
    idle = [x["idle_us"] for x in r["status"]]
    call = [x["ms"] for x in r["call"]]
    ratio = [dd["per_s"] / b["per_s"] for dd, b in zip(r["durable"], r["bare"])]
    lines = [
        f"daemon.status: daemon CPU {_spread(st)} µs/request "
        f"({_spread([x['per_s'] for x in r['status']], '{:,.0f}')} requests/s); baselines: a bare "
        f"trio line server (receive_some + send_all) {_spread(r['echo'])} µs/request, the idle "
        f"daemon over the same wall time {_spread(idle, '{:.2f}')} µs/request, msgspec "
        f"decode+encode floor {floor:.2f} µs -> {_verdict(statistics.median(st), GOALS['status_us'])}",
        f"`true` call: daemon CPU {_spread(call, '{:.2f}')} ms/call "
        f"({_spread([x['per_s'] for x in r['call']])} calls/s); beside it the call host's own: "
        f"start (reaped by dshd) {_spread([x['start_ms'] for x in r['call']], '{:.2f}')} ms, "
        f"host after its fork (+ the command) {_spread([x['host_ms'] for x in r['call']], '{:.2f}')}"
        f" ms -> {_verdict(statistics.median(call), GOALS['call_ms'])}",
    ]
    if fs is not None:
        lines.append(f"fsyncs (strace -f -y): per `true` call {fs['log_per_call']:.2f} of the session "
                     f"log (the barrier, covering tool/call and its approval pair; the result) + "
                     f"{fs['host_per_call']:.2f} of the call host's files + {fs['other_per_call']:.2f} "
                     f"other; {fs['per_status']:.2f} per daemon.status; {fs['per_event']:.3f} log fsyncs per durable "
                     f"event over {SESSIONS}×{CLIENTS} clients ({fs['events']} events under strace); "
                     f"bare baseline: 1.000 per event")
    lines.append(
        f"durable events/s, {SESSIONS} sessions × {CLIENTS} clients: "
        f"{_spread([x['per_s'] for x in r['durable']], '{:,.0f}')} (daemon CPU "
        f"{_spread([x['cpu_us'] for x in r['durable']], '{:.0f}')} µs/event); bare os.write+os.fsync, "
        f"{SESSIONS} files × {CLIENTS} threads (1 event per fsync): "
        f"{_spread([x['per_s'] for x in r['bare']], '{:,.0f}')} -> ratio {_spread(ratio, '{:.2f}')}x, "
        f"{_verdict(statistics.median(ratio), GOALS['durable_ratio'], higher=True)}")
    for name, values in cli.items():
        goal = {"dsh --version": GOALS["version_ms"], "dsh run -- true": GOALS["run_ms"]}.get(name)
        tail = f" -> {_verdict(statistics.median(values), goal)}" if goal else " (baseline)"
        lines.append(f"client CPU {name}: {_spread(values)} ms over {len(values)} runs{tail}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.requests", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts, one round (smoke run)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=2000, help="daemon.status per round")
    p.add_argument("--calls", type=int, default=60, help="`true` calls per round")
    p.add_argument("--seconds", type=float, default=3.0, help="durable phase per round, s")
    p.add_argument("--chunk", type=int, default=400, help="bare baseline chunk, bytes "
                   "(a compressed one-event frame + trailer)")
    p.add_argument("--cli-runs", type=int, default=10)
    p.add_argument("--no-strace", action="store_true", help="skip the fsync count")
    p.add_argument("--echo-server", metavar="PATH", help=argparse.SUPPRESS)  # the baseline's child
    args = p.parse_args(argv)
    if args.echo_server:
        trio.run(_echo_serve, args.echo_server)
        return 0
    if args.quick:
        args.rounds, args.requests, args.calls, args.seconds, args.cli_runs = 1, 300, 10, 1.0, 3
    with BenchDaemon(CONFIG) as d:
        assert d.proc is not None
        reaper = Reaper({d.proc.pid})
        r = trio.run(_measure, d, reaper, args)
        fs = None
        if not args.no_strace and not args.quick:
            fs = _fsync_phase(d, reaper, max(20, args.calls // 2), min(args.seconds, 2.0))
        cli = _cli_runs(d.socket, args.cli_runs)
        reaper.reap()
    print(report(r, fs, cli, _floor_us()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
