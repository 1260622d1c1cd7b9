"""Malformed input on many connections against a real dshd, and ``daemon.status`` latency
under that load next to the idle latency (``python -m bench wire_fuzz``).

Theory of operation: :class:`FuzzLoad` runs ``workers`` threads until stopped. Each loops:
open a raw Unix-socket connection, play one scenario picked by its own ``random.Random``
(seeded ``seed + worker``, so a run is replayable from the seed it prints), and close it
(abruptly, or by half-closing and reading to EOF). Scenarios: random bytes, truncated JSON,
deep nesting, huge numbers and NaN, response and error objects, bad envelopes, batches of mixed
junk, empty batches, batches with ``subscribe``, batches over the entry bound, long lines that
are parsed off the event loop, oversized lines, partial lines left hanging, requests before
``initialize``, known methods with junk params, half-closes and abrupt closes.

The load also checks what it can see from outside: every line dshd sends is one JSON-RPC
message (an object, or a non-empty array of them), and a half-closed connection gets an
answer to every request it sent before closing. What does not hold lands in
``FuzzLoad.violations`` (with the worker, the scenario and the seed). :func:`status_latencies`
is the control client: ``daemon.status`` on one connection, again and again, each answer's
latency recorded; the test bounds each one (liveness), the bench prints p50/p99. It never
asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

__all__ = ["FUZZ_CONFIG", "FuzzLoad", "status_latencies", "fd_count", "main"]

#: Limits the fuzz daemon runs with: small enough that oversized lines and the shared line
#: budget are reached often, at little cost.
FUZZ_CONFIG = {
    "max_message_bytes": 1024 * 1024,
    "max_buffered_bytes": 2 * 1024 * 1024,
    "max_connections": 64,
    "max_batch_entries": 1000,
}

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
JUNK_ELEMENTS = [
    {"jsonrpc": "2.0", "id": 7, "result": {}},
    {"jsonrpc": "2.0", "id": 8, "error": {"code": -32000, "message": "x"}},
    {"jsonrpc": "2.0", "id": None, "result": None},
    {"jsonrpc": "2.0", "id": 9, "method": "daemon.status", "result": {}},
    {"jsonrpc": "2.0", "id": 1.5, "method": "daemon.status"},
    {"jsonrpc": "2.0", "id": [1], "method": "daemon.status"},
    {"jsonrpc": "2.0", "id": True, "method": "daemon.status"},
    {"jsonrpc": "2.0", "id": 11, "method": 5},
    {"jsonrpc": "2.0", "id": 12, "method": "daemon.status", "params": 3},
    {"jsonrpc": "1.0", "id": 13, "method": "daemon.status"},
    {"id": 14, "method": "daemon.status"},
    {"jsonrpc": "2.0"},
    {"jsonrpc": "2.0", "method": "daemon.status"},  # a notification: no answer
    {"jsonrpc": "2.0", "id": "s", "method": "no.such.method"},
    1, "str", None, [], [[]], {},
]
RAW_LINES = [
    b'{"jsonrpc":"2.0","id":1e400,"method":"daemon.status"}',
    b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"daemon.status"}',
    b'{"jsonrpc":"2.0","id":-1e400,"method":"daemon.status","params":{"x":1e999}}',
    b'{"jsonrpc":"2.0","id":NaN,"method":"daemon.status"}',
    b'{"jsonrpc":"2.0","id":1,"method":"daemon.status","params":{"x":Infinity}}',
    b'{"jsonrpc":"2.0","id":1,"method":"daemon.\xff\xfe"}',
    b'{"jsonrpc":"2.0","id":"\xed\xa0\x80","method":"daemon.status"}',
    b'{"jsonrpc":"2.0","id":1,"method":"daemon.status"}{"jsonrpc":"2.0","id":2}',
    b'{"jsonrpc":"2.0","id":1,"method":"daemon.status",}',
    b"[]", b"[ ]", b"[,]", b"[1,]", b"{", b"}", b"null", b"true", b"-0", b'"\\u0000"',
    b"\x00\x00\x00", b"\r", b"\t ",
]
PARAM_METHODS = ["daemon.status", "session.get", "session.events", "tool.wait", "tool.cancel",
                 "unsubscribe", "approval.decide", "turn.cancel", "session.list"]


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _req(rid, method: str, params=None) -> dict:
    r = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        r["params"] = params
    return r


def _line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _check(line: bytes) -> str | None:
    """None when ``line`` is one JSON-RPC message from dshd; else what is wrong with it."""
    try:
        msg = json.loads(line)
    except ValueError:
        return f"not JSON: {line[:200]!r}"
    items = msg if isinstance(msg, list) else [msg]
    if isinstance(msg, list) and not msg:
        return "an empty array"
    for m in items:
        if not isinstance(m, dict) or m.get("jsonrpc") != "2.0":
            return f"not a JSON-RPC message: {line[:200]!r}"
        if m.get("method") == "stream":
            continue
        if "id" not in m or ("result" in m) == ("error" in m):
            return f"neither a result nor an error: {line[:200]!r}"
    return None


def _ids(line: bytes) -> list:
    msg = json.loads(line)
    return [m.get("id") for m in (msg if isinstance(msg, list) else [msg])
            if isinstance(m, dict) and "method" not in m]


class _Conn:
    def __init__(self, path: Path, timeout: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def lines(self, until_eof: bool, wait: float) -> list[bytes]:
        """Lines received until EOF (``until_eof``) or until ``wait`` s pass without data."""
        out = []
        if not until_eof:
            self.sock.settimeout(wait)
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                if until_eof:
                    raise
                break
            if not chunk:
                break
            self.buf += chunk
            *done, self.buf = self.buf.split(b"\n")
            out += done
        return out

    def close(self) -> None:
        self.sock.close()


class FuzzLoad:
    """``workers`` threads sending malformed input to the daemon at ``path`` (see module doc)."""

    def __init__(self, path: Path, *, seed: int, workers: int = 20,
                 session_id: str | None = None) -> None:
        self.path = Path(path)
        self.seed = seed
        self.workers = workers
        self.session_id = session_id or "s-none"
        self.violations: list[str] = []
        self.scenarios: Counter[str] = Counter()
        self.lines_received = 0
        self.refused = 0  # connections closed by a limit (-32013), or reset while sending
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # -- running ---------------------------------------------------------------------------
    def start(self) -> "FuzzLoad":
        for i in range(self.workers):
            t = threading.Thread(target=self._worker, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = sum(t.is_alive() for t in self._threads)
        if alive:
            self._violation(-1, "stop", f"{alive} worker(s) still blocked after {timeout} s")

    def _violation(self, worker: int, scenario: str, what: str) -> None:
        with self._lock:
            self.violations.append(f"seed={self.seed} worker={worker} scenario={scenario}: {what}")

    def _worker(self, i: int) -> None:
        rng = random.Random(self.seed + i)
        names = [n for n in dir(self) if n.startswith("_play_")]
        weights = {"_play_oversized": 1, "_play_partial": 3, "_play_long_line": 2}
        w = [weights.get(n, 6) for n in names]
        while not self._stop.is_set():
            name = rng.choices(names, w)[0]
            with self._lock:
                self.scenarios[name[6:]] += 1
            try:
                getattr(self, name)(rng, i)
            except (BrokenPipeError, ConnectionResetError):
                with self._lock:
                    self.refused += 1
            except TimeoutError:
                self._violation(i, name[6:], "the daemon did not answer or close within 10 s")
            except OSError as exc:
                self._violation(i, name[6:], f"{exc!r}")
            except Exception as exc:  # noqa: BLE001 - a bug here must show, not end the worker
                self._violation(i, name[6:], f"the load itself failed: {exc!r}")

    def _finish(self, conn: _Conn, rng: random.Random, i: int, scenario: str,
                expect_ids: list | None = None) -> None:
        """Half-close and read to EOF, or read briefly and close abruptly; check the lines."""
        half = expect_ids is not None or rng.random() < 0.5
        try:
            if half:
                conn.sock.shutdown(socket.SHUT_WR)
            lines = conn.lines(until_eof=half, wait=rng.choice([0.01, 0.05, 0.2]))
        finally:
            conn.close()
        seen = []
        for line in lines:
            bad = _check(line)
            if bad:
                self._violation(i, scenario, bad)
                continue
            seen += _ids(line)
        if any(b'"code":-32013' in line for line in lines):
            with self._lock:
                self.refused += 1
            return
        with self._lock:
            self.lines_received += len(lines)
        if expect_ids is not None:
            missing = [x for x in expect_ids if x not in seen]
            if missing:
                self._violation(i, scenario, f"half-closed, no answer for ids {missing}")

    def _open(self, rng: random.Random, init: float = 0.7) -> _Conn:
        conn = _Conn(self.path, timeout=10)
        if rng.random() < init:
            conn.send(_line(INIT))
        return conn

    # -- scenarios ---------------------------------------------------------------------------
    def _play_random_bytes(self, rng, i) -> None:
        conn = self._open(rng)
        data = bytearray(rng.randbytes(rng.randint(1, 4096)))
        for _ in range(rng.randint(0, 8)):
            data.insert(rng.randint(0, len(data)), 10)
        conn.send(bytes(data) + b"\n")
        self._finish(conn, rng, i, "random_bytes")

    def _play_truncated(self, rng, i) -> None:
        conn = self._open(rng)
        full = _line(_req(1, rng.choice(PARAM_METHODS), {"sessionId": self.session_id}))
        conn.send(full[: rng.randint(1, len(full) - 2)] + rng.choice([b"\n", b""]))
        self._finish(conn, rng, i, "truncated")

    def _play_deep(self, rng, i) -> None:
        conn = self._open(rng)
        depth = rng.choice([64, 1000, 10_000, 100_000])
        opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
        body = opener * depth + b"1" + closer * depth
        conn.send((body if rng.random() < 0.5 else
                   b'{"jsonrpc":"2.0","id":1,"method":"daemon.status","params":{"x":' + body + b"}}")
                  + b"\n")
        self._finish(conn, rng, i, "deep")

    def _play_raw_lines(self, rng, i) -> None:
        conn = self._open(rng)
        conn.send(b"\n".join(rng.choices(RAW_LINES, k=rng.randint(1, 6))) + b"\n")
        self._finish(conn, rng, i, "raw_lines")

    def _play_envelopes(self, rng, i) -> None:
        conn = self._open(rng)
        picks = [e for e in rng.choices(JUNK_ELEMENTS, k=rng.randint(1, 8))]
        conn.send(b"".join(_line(e) for e in picks))
        self._finish(conn, rng, i, "envelopes")

    def _play_mixed_batch(self, rng, i) -> None:
        conn = self._open(rng)
        batch = []
        for n in range(rng.randint(1, 40)):
            if rng.random() < 0.4:
                batch.append(_req(100 + n, rng.choice(PARAM_METHODS), {"sessionId": self.session_id,
                                                                        "callId": "c-x", "timeout": 0}))
            else:
                batch.append(rng.choice(JUNK_ELEMENTS))
        conn.send(_line(rng.choice([batch, [], [[]], [batch]])))
        self._finish(conn, rng, i, "mixed_batch")

    def _play_batch_subscribe(self, rng, i) -> None:
        conn = self._open(rng, init=1.0)
        batch = [_req(1, "subscribe", {"sessionId": self.session_id}), _req(2, "daemon.status"),
                 _req(3, "session.get", {"sessionId": self.session_id})]
        rng.shuffle(batch)
        conn.send(_line(batch))
        self._finish(conn, rng, i, "batch_subscribe", expect_ids=[0, 1, 2, 3])

    def _play_long_line(self, rng, i) -> None:
        """Over offload_parse_bytes: parsed on a worker thread (and over the batch bound)."""
        conn = self._open(rng, init=1.0)
        n = rng.choice([10, 1000, 1001, 1500])
        pad = "x" * rng.choice([10, 100, 1000])
        batch = [_req(k, "daemon.status", {"pad": pad}) for k in range(1, n + 1)]
        conn.send(_line(batch))
        self._finish(conn, rng, i, "long_line")

    def _play_oversized(self, rng, i) -> None:
        conn = self._open(rng)
        size = FUZZ_CONFIG["max_message_bytes"] + rng.randint(1, 200_000)
        conn.send(b"x" * size + b"\n" + _line(_req(1, "daemon.status")))
        self._finish(conn, rng, i, "oversized")

    def _play_partial(self, rng, i) -> None:
        """Half a line, left hanging for a moment, then cut off."""
        conn = self._open(rng)
        conn.send(b'{"jsonrpc":"2.0","id":1,"method":"daemon.status","params":{"pad":"'
                  + b"y" * rng.randint(1, 1_000_000))
        time.sleep(rng.random() * 0.5)
        self._finish(conn, rng, i, "partial")

    def _play_pre_init(self, rng, i) -> None:
        conn = self._open(rng, init=0.0)
        conn.send(_line(_req(1, "daemon.status")) + _line(_req(2, "session.list")))
        self._finish(conn, rng, i, "pre_init", expect_ids=[1, 2])

    def _play_junk_params(self, rng, i) -> None:
        conn = self._open(rng, init=1.0)
        values = [None, 1, -1, 2**63, 1.5, "", "x" * 100, "../../etc", [], {}, True,
                  self.session_id, "__proto__"]
        sent = []
        for n in range(rng.randint(1, 10)):
            params = {k: rng.choice(values) for k in rng.sample(
                ["sessionId", "callId", "timeout", "afterSeq", "limit", "subscriptionId",
                 "approvalId", "decision"], rng.randint(0, 4))}
            if params.get("timeout") is not None and not isinstance(params["timeout"], bool) \
                    and isinstance(params["timeout"], (int, float)):
                params["timeout"] = 0  # never a long wait
            conn.send(_line(_req(10 + n, rng.choice(PARAM_METHODS),
                                 rng.choice([params, [], None]))))
            sent.append(10 + n)
        self._finish(conn, rng, i, "junk_params", expect_ids=[0, *sent])

    def _play_half_close(self, rng, i) -> None:
        conn = self._open(rng, init=1.0)
        reqs = [_req(1, "daemon.status"),
                _req(2, "tool.wait", {"sessionId": self.session_id, "callId": "c-none",
                                      "timeout": 0.2}),
                _req(3, "session.get", {"sessionId": self.session_id})]
        conn.send(b"".join(_line(r) for r in reqs))
        self._finish(conn, rng, i, "half_close", expect_ids=[0, 1, 2, 3])

    def _play_abrupt(self, rng, i) -> None:
        conn = self._open(rng)
        conn.send(b"".join(_line(_req(k, "daemon.status")) for k in range(rng.randint(1, 50)))
                  + b'{"jsonrpc":"2.0","id":99,"meth')
        conn.close()


def _one_line(conn: _Conn) -> bytes:
    """The next line (the socket's timeout bounds each wait)."""
    while b"\n" not in conn.buf:
        chunk = conn.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the daemon closed the control connection")
        conn.buf += chunk
    line, conn.buf = conn.buf.split(b"\n", 1)
    return line


def status_latencies(path: Path, stop: threading.Event, *, bound: float,
                     interval: float = 0.05) -> list[float]:
    """``daemon.status`` on one connection until ``stop`` is set: each answer's latency, s.
    Raises TimeoutError when one takes longer than ``bound``."""
    conn = _Conn(path, timeout=bound)
    out = []
    try:
        conn.send(_line(INIT))
        _one_line(conn)
        rid = 0
        while not stop.is_set():
            rid += 1
            t0 = time.perf_counter()
            conn.send(_line(_req(rid, "daemon.status")))
            _one_line(conn)
            took = time.perf_counter() - t0
            if took > bound:
                raise TimeoutError(f"daemon.status took {took:.2f} s (bound {bound} s)")
            out.append(took)
            stop.wait(interval)
    finally:
        conn.close()
    return out


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def main(argv: list[str]) -> int:
    from .dshd_proc import BenchDaemon

    ap = argparse.ArgumentParser(prog="python -m bench wire_fuzz")
    ap.add_argument("--seconds", type=float, default=20.0, help="idle and loaded phase, each")
    ap.add_argument("--workers", type=int, default=20)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args(argv)
    with BenchDaemon(FUZZ_CONFIG, prefix="dsf-") as d:
        stop = threading.Event()
        threading.Timer(args.seconds, stop.set).start()
        idle = status_latencies(d.socket, stop, bound=60)
        load = FuzzLoad(d.socket, seed=args.seed, workers=args.workers).start()
        stop = threading.Event()
        threading.Timer(args.seconds, stop.set).start()
        loaded = status_latencies(d.socket, stop, bound=60)
        load.stop()
        rss = d.peak_rss_kib()
    print(f"seed {args.seed}, {args.workers} workers, {args.seconds:g} s per phase; "
          f"{sum(load.scenarios.values())} fuzz connections, {load.refused} refused/reset, "
          f"{len(load.violations)} violations")
    for name, xs in (("idle", idle), ("fuzz", loaded)):
        print(f"daemon.status {name:5s}: n={len(xs):5d}  p50={_pct(xs, 50) * 1e3:7.2f} ms  "
              f"p99={_pct(xs, 99) * 1e3:7.2f} ms  max={max(xs) * 1e3:7.2f} ms  "
              f"mean={statistics.fmean(xs) * 1e3:7.2f} ms")
    print(f"peak RSS {rss / 1024:.0f} MiB")
    for v in load.violations[:10]:
        print("violation:", v)
    return 1 if load.violations else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
