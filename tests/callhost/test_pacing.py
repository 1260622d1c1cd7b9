"""The host's cost per wake-up at slow flows, and its progress pacing (HOST.md §2, issue 14).

A real host reads a real producer. At a slow flow (a line every 10 ms) a wake-up is one
``read`` of the output and one ``write`` to the log (plus the progress ``sendto`` and the
``epoll_wait`` itself): no re-registration with epoll per line and no 1 MiB read buffer
mapped and unmapped per line (counted with ``strace -c`` on the host). Under a flow of
~1,000 lines/s, progress events are coalesced to the daemon's publish interval, and the
last one of the flow still reports its exact end. Nothing here measures time: counts of
events and syscalls only, with slack for a loaded machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.callhost import helpers

#: Writes argv[1] lines, argv[2] seconds apart, once a line came on stdin; then waits for
#: another line before it exits (so the flow's end is seen while the command still runs).
PRODUCER = ("import os, sys, time\n"
            "sys.stdin.readline()\n"
            "n, gap = int(sys.argv[1]), float(sys.argv[2])\n"
            "t0 = time.monotonic()\n"
            "for i in range(n):\n"
            "    d = t0 + i * gap - time.monotonic()\n"
            "    d > 0 and time.sleep(d)\n"
            "    os.write(1, b'line %06d\\n' % i)\n"
            "sys.stdin.readline()\n")

LINE = len(b"line 000000\n")


def _producer(hosts, lines: int, gap: float) -> helpers.HostRun:
    return hosts([sys.executable, "-I", "-S", "-c", PRODUCER, str(lines), str(gap)],
                 stdin="pipe")


def test_a_flow_of_1000_lines_per_second_gets_one_progress_per_publish_interval(hosts):
    lines = 1000
    run = _producer(hosts, lines, 0.001)
    conn = run.connect()
    conn.request("attach")
    conn.write(b"go\n")
    started = time.monotonic()
    progress: list[dict] = []
    while not progress or progress[-1]["endOffset"] < lines * LINE:
        msg = conn.read_line()
        assert msg is not None and msg.get("event") != "exit", msg
        if msg.get("event") == "progress":
            progress.append(msg)
    span = time.monotonic() - started  # an upper bound of the flow's sending span
    # the flow's last event (sent by the deferred deadline: nothing more is written) is exact
    assert progress[-1] == {"event": "progress", "endOffset": lines * LINE, "firstOffset": 0,
                            "totalLines": lines}
    assert [p["endOffset"] for p in progress] == sorted({p["endOffset"] for p in progress})
    # at most one per 10 ms (the daemon's publish interval) after a burst of a few: ~100
    # events for ~1 s of flow, not one per 2 ms wake
    bound = span / 0.010 + 3
    assert len(progress) <= bound, (len(progress), span)
    conn.write(b"end\n")
    record = conn.next_event("exit")["record"]
    assert record["totalBytes"] == lines * LINE and record["totalLines"] == lines
    assert run.output() == b"".join(b"line %06d\n" % i for i in range(lines))


def test_a_progress_event_is_the_fixed_json_line(hosts):
    """The host writes its progress line from a template: it is exactly the JSON object."""
    run = _producer(hosts, 3, 0.0)
    conn = run.connect()
    conn.request("attach")
    conn.write(b"go\n")
    raw = b""
    while b'"totalLines":3}' not in raw:
        chunk = conn.sock.recv(65536)
        assert chunk, raw
        raw += chunk
    for line in raw.split(b"\n"):
        if b'"event":"progress"' in line:
            obj = json.loads(line)
            assert line == json.dumps(obj, separators=(",", ":")).encode()
            assert list(obj) == ["event", "endOffset", "firstOffset", "totalLines"]
    conn.write(b"end\n")
    conn.next_event("exit")


def _strace_counts(path: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    with open(path) as f:
        for row in f:
            parts = row.split()
            if len(parts) >= 5 and parts[-1].isidentifier() and parts[3].isdigit():
                counts[parts[-1]] = int(parts[3])
    return counts


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_slow_flow_costs_a_read_and_a_write_per_line(hosts, tmp_path):
    lines = 100
    run = _producer(hosts, lines, 0.01)  # 100 lines/s
    conn = run.connect()
    conn.request("attach")
    out = tmp_path / "strace.txt"
    tracer = subprocess.Popen(["strace", "-c", "-p", str(run.pid), "-o", str(out)],
                              stderr=subprocess.PIPE, text=True)
    try:
        assert "attached" in tracer.stderr.readline()
        conn.write(b"go\n")
        while conn.next_event("progress")["endOffset"] < lines * LINE:
            pass
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=helpers.LIVENESS)
    counts = _strace_counts(str(out))
    assert counts.get("read", 0) >= lines // 2, counts  # it did trace the flow
    # per line: epoll_wait, read, write, sendto; what a wake must not add per line:
    extra = {name: counts.get(name, 0)
             for name in ("epoll_ctl", "mmap", "munmap", "mremap", "brk", "clock_nanosleep")}
    assert sum(extra.values()) < lines // 4, counts
    assert counts.get("fsync", 0) <= 4, counts  # at most once a second (plus the end)
    conn.write(b"end\n")
    conn.next_event("exit")
