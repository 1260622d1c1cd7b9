"""Benchmarks (``python -m bench`` runs them all; ``python -m bench NAME`` runs one).

Theory of operation: each bench is a module of this package with ``main(argv) -> int`` that
prints its own figures; ``BENCHES`` names them, one registration line each. Benches measure and
print; they never assert on time.
"""

BENCHES: list[str] = [
    "durability",  # SessionLog: durable events/s, group commit, flush latency vs bare fsync
    "streaming",  # live views: throughput, latency, wire bytes, memory, fan-out, codec ops/s
    "host",  # the call host: 1 GiB throughput and CPU, RSS per idle host, call start-up
    "hostpath",  # the host's write path, variant by variant (read/readv/splice, the count)
    "hostwake",  # the host's CPU per line at a slow flow (100 lines/s) vs a bare loop's wake
    "wire_fuzz",  # daemon.status latency idle vs under malformed input on 20 connections
    "soak",  # daemon RSS over a churn soak (connect, subscribe, calls, abrupt disconnects)
    "requests",  # daemon CPU per request and per call, fsyncs per call, durable events/s, CLI start
    "storage",  # open (repair) of 10k/100k/1M-event logs: wall, RSS; listing 10,000 sessions
    "lanes",  # 1-100 concurrent calls: write -> mirror latency; lane leave after a big batch
    "bench_tui_latency",  # TUI: a keypress to its frame while a 1 GiB flood streams in OutputView
]

#: Arguments each bench gets under ``python -m bench --quick`` (a smoke run with small sizes).
QUICK_ARGV: dict[str, list[str]] = {
    "durability": ["--events", "200"],
    "streaming": ["--quick"],
    "host": ["--quick"],
    "hostpath": ["--quick"],
    "hostwake": ["--quick"],
    "wire_fuzz": ["--seconds", "3"],
    "soak": ["--seconds", "20", "--sample", "2", "--workers", "2", "--sessions", "6"],
    "requests": ["--quick"],
    "storage": ["--quick"],
    "lanes": ["--quick"],
    "bench_tui_latency": ["--quick"],
}
