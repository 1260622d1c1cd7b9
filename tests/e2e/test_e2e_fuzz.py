"""Malformed input on many connections never stalls, crashes or leaks (issue 10, "Must show").

For about a minute, 20 connections at once send what ``bench.wire_fuzz.FuzzLoad`` makes of a
seeded random generator (random bytes, truncated and deeply nested JSON, huge numbers and NaN,
response objects, junk batches, empty batches, batches with ``subscribe``, long and oversized
lines, partial lines, half-closes, abrupt closes) to a real ``dshd`` over its real socket,
while a control client asks ``daemon.status`` again and again: each answer within 5 s (a
liveness bound, not a benchmark: ``python -m bench wire_fuzz`` measures the latency). After it,
the daemon is alive, its open file descriptors are back to where they started, its peak RSS is
bounded, every line it sent was one JSON-RPC message, every half-closed connection got all its
answers, and its log has no crash. The seed is printed (replay: ``DSH_FUZZ_SEED=N``).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from bench.wire_fuzz import FUZZ_CONFIG, FuzzLoad, fd_count, status_latencies

from .conftest import running_daemon
from .test_e2e_hardening_wire import RawClient

SECONDS = float(os.environ.get("DSH_FUZZ_SECONDS", "45"))


@pytest.fixture
def fuzz_daemon():
    config = "".join(f"{k} = {v}\n" for k, v in FUZZ_CONFIG.items())
    with running_daemon(config, ("--log-level", "warning"), prefix="dsh-fuzz-") as d:
        yield d


def _settled_fds(pid: int, target: int, seconds: float = 15.0) -> int:
    deadline = time.monotonic() + seconds
    n = fd_count(pid)
    while n != target and time.monotonic() < deadline:
        time.sleep(0.1)
        n = fd_count(pid)
    return n


def test_fuzzed_connections_never_stall_crash_or_leak(fuzz_daemon, workdir):
    d = fuzz_daemon
    seed = int(os.environ.get("DSH_FUZZ_SEED", time.time_ns() % 2**32))
    print(f"fuzz seed {seed} (replay with DSH_FUZZ_SEED={seed})")
    c = RawClient(d.socket).init()
    sid = c.call(1, "session.create", {"cwd": str(workdir)})["result"]["sessionId"]
    c.close()
    time.sleep(0.3)
    fds_before = fd_count(d.pid)

    load = FuzzLoad(d.socket, seed=seed, workers=20, session_id=sid).start()
    stop = threading.Event()
    timer = threading.Timer(SECONDS, stop.set)
    timer.start()
    try:
        latencies = status_latencies(d.socket, stop, bound=5.0, interval=0.1)
    finally:
        timer.cancel()
        load.stop()
    assert d.running, f"seed {seed}: dshd died:\n{d.log_tail()}"
    assert len(latencies) > 10, f"seed {seed}: the control client got {len(latencies)} answers"
    assert not load.violations, "\n".join(load.violations[:20])
    assert sum(load.scenarios.values()) > 100, load.scenarios
    assert load.refused, f"seed {seed}: no connection ever met a limit: {load.scenarios}"

    fds_after = _settled_fds(d.pid, fds_before)
    assert fds_after == fds_before, f"seed {seed}: {fds_after} fds open, {fds_before} at start"
    assert d.peak_rss_kib() < 500 * 1024, f"seed {seed}: peak RSS {d.peak_rss_kib()} KiB"
    log = d.log_path.read_text(errors="replace")
    for marker in ("connection.crashed", "rpc.internal_error", "Traceback"):
        assert marker not in log, f"seed {seed}: {marker} in the daemon log:\n{d.log_tail(60)}"
    # Still serving as before, on a fresh connection.
    c = RawClient(d.socket).init()
    assert c.call(2, "session.get", {"sessionId": sid})["result"]["sessionId"] == sid
    c.close()
    print(f"fuzz seed {seed}: {dict(load.scenarios)}; refused {load.refused}; "
          f"{len(latencies)} status answers, max {max(latencies):.3f} s")
