"""The call host's CPU per line at a slow flow (issue 14: 100 calls x 100 lines/s).

Theory of operation: at a slow flow a host wakes once per line, so its CPU per line is its
cost per wake-up, and bench/lanes.py's 100-call figure is set by it (100 hosts x 100 lines/s
share the machine's two cores with the daemon). One real call (a real daemon,
``bench.dshd_proc.BenchDaemon``, the real client, a real host) runs a program that prints a
line every 1/RATE s; over a steady window the bench reads the host's
``/proc/PID/schedstat`` run time (ns, exact) and ``/proc/PID/stat`` utime+stime (ticks), and
counts the lines that reached the log in that window (the log's growth / the line's length).
Baseline in the same run, interleaved round by round: the floor of a wake on this machine, a
bare Python loop (``epoll_wait``, ``read`` of a pipe, ``write`` to a file, ``send`` of a
short line to a process blocked reading it) fed by the same producer. Printed: the median and
min..max over the rounds, the ratio to the floor, and what 100 such hosts at 100 lines/s
take of a core. Nothing asserts on time.
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

from client.api import connect

from .dshd_proc import BenchDaemon

#: The interpreter of the programs (its real binary, no site: see bench/lanes.py).
PY = f"{os.path.realpath(sys.executable)} -I -S"
#: Prints a 20-byte line (19 digits and a newline) every argv[2] s for argv[1] lines.
PRODUCER = (
    "import os,sys,time\n"
    "n=int(sys.argv[1]); gap=float(sys.argv[2]); t0=time.monotonic()\n"
    "for i in range(n):\n"
    "    d=t0+i*gap-time.monotonic()\n"
    "    d>0 and time.sleep(d)\n"
    "    os.write(1,b\"%019d\\n\"%i)\n"
)
LINE = 20
#: The floor: PRODUCER into a pipe, a bare loop that reads it, appends it to a file and sends
#: a short line to a child blocked in recv; prints the loop's run time (ns) and its wakes.
FLOOR = (
    "import os,select,socket,sys,tempfile\n"
    "n, gap = sys.argv[1], sys.argv[2]\n"
    "r, w = os.pipe(); a, b = socket.socketpair()\n"
    "fd, path = tempfile.mkstemp(); os.unlink(path)\n"
    "if os.fork() == 0:\n"
    "    os.dup2(w, 1); os.execv(sys.executable, [sys.executable, '-I', '-S', '-c', sys.argv[3],"
    " n, gap])\n"
    "os.close(w)\n"
    "if os.fork() == 0:\n"
    "    a.close()\n"
    "    while b.recv(65536): pass\n"
    "    os._exit(0)\n"
    "b.close(); ep = select.epoll(); ep.register(r, select.EPOLLIN)\n"
    "def rt(): return int(open('/proc/self/schedstat').read().split()[0])\n"
    "skip = int(n) // 5; wakes = 0\n"
    "while True:\n"
    "    if wakes == skip: t0 = rt()\n"
    "    ep.poll(5.0)\n"
    "    data = os.read(r, 65536)\n"
    "    if not data: break\n"
    "    os.write(fd, data); a.send(b'{\"event\":\"progress\",\"endOffset\":%d}\\n' % wakes)\n"
    "    wakes += 1\n"
    "print(rt() - t0, wakes - skip)\n"
)


def _runtime_s(pid: int) -> float:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def _ticks_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def floor_round(rate: int, seconds: float) -> float:
    """µs of run time per wake of the bare loop."""
    n = int(seconds * rate * 1.25)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", FLOOR, str(n), str(1 / rate),
                          PRODUCER], capture_output=True, text=True, check=True,
                         timeout=seconds * 3 + 60)
    ns, wakes = map(int, out.stdout.split())
    return ns / 1e3 / max(1, wakes)


async def host_round(d: BenchDaemon, client, rate: int, seconds: float) -> dict:
    """One call at ``rate`` lines/s: the host's run time and ticks per line over the window."""
    sid = await client.create_session(str(d.work), "hostwake", sandbox="danger-full-access")
    n = int((seconds + 2.5) * rate)
    cid = await client.run_tool(sid, f"{PY} -c '{PRODUCER}' {n} {1 / rate}")
    call_dir = d.state_dir / "sessions" / sid / "calls" / cid
    while not (call_dir / "host.json").exists():
        await trio.sleep(0.01)
    pid = json.loads((call_dir / "host.json").read_text())["pid"]
    await trio.sleep(1.0)  # past the host's and the producer's start
    log = call_dir / "output.raw"
    a = (_runtime_s(pid), _ticks_s(pid), log.stat().st_size)
    await trio.sleep(seconds)
    b = (_runtime_s(pid), _ticks_s(pid), log.stat().st_size)
    lines = (b[2] - a[2]) // LINE
    result = await client.wait(sid, cid)
    if result.details.truncation.total_lines != n:
        raise RuntimeError(f"the call counted {result.details.truncation.total_lines} lines, "
                           f"not {n}")
    return {"run_us": (b[0] - a[0]) * 1e6 / max(1, lines),
            "tick_us": (b[1] - a[1]) * 1e6 / max(1, lines), "lines": lines}


async def bench(rounds: int, rate: int, seconds: float) -> dict:
    runs: dict[str, list] = {"floor": [], "host": []}
    with BenchDaemon() as d:
        async with connect(d.socket, "hostwake") as client:
            for r in range(rounds):
                for which in (("floor", "host") if r % 2 == 0 else ("host", "floor")):
                    if which == "floor":
                        runs["floor"].append(await trio.to_thread.run_sync(
                            floor_round, rate, seconds))
                    else:
                        runs["host"].append(await host_round(d, client, rate, seconds))
    return runs


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} [{min(values):.0f}..{max(values):.0f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hostwake",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one short round (a smoke run)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=int, default=100, help="lines per second")
    p.add_argument("--seconds", type=float, default=10.0, help="steady window per round")
    args = p.parse_args(argv)
    rounds, seconds = (1, 2.0) if args.quick else (max(1, args.rounds), args.seconds)
    t0 = time.perf_counter()
    runs = trio.run(bench, rounds, args.rate, seconds)
    host = [x["run_us"] for x in runs["host"]]
    ticks = [x["tick_us"] for x in runs["host"]]
    floor = runs["floor"]
    ratio = statistics.median(host) / statistics.median(floor)
    print(f"host wake: one call at {args.rate} lines/s, {seconds:g} s windows, median "
          f"[min..max] of {rounds} interleaved rounds (lines per window "
          f"{[x['lines'] for x in runs['host']]}):")
    print(f"  host CPU per line: {_spread(host)} µs run time (schedstat), {_spread(ticks)} µs "
          f"utime+stime; floor (a bare epoll/read/write/send loop) {_spread(floor)} µs per wake;"
          f" ratio {ratio:.2f}x")
    share = statistics.median(host) * 100 * 100 / 1e6
    print(f"  100 such hosts at 100 lines/s: {share * 100:.0f} % of a core (the floor's: "
          f"{statistics.median(floor) * 100 * 100 / 1e4:.0f} %); bench/lanes.py's 100-call goal "
          f"(p50 <= 10 ms) needs the hosts, the producers and the daemon to fit in 2 cores "
          f"[{time.perf_counter() - t0:.1f} s]")
    if args.quick:
        print("(--quick: one short round; a smoke run, not figures)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
