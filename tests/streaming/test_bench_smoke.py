"""Smoke test of the streaming benches in quick mode: ``bench.wire`` (in process) and
``bench.lanes`` (a real daemon).

Asserts correctness only -- a client mirror fed every notification line ends equal to the
producer's value, the figures are consistent -- never time.
"""

from __future__ import annotations

import msgspec

from bench.wire import CALL_ID, build_log, lane_stream, microbench, wire_efficiency
from protocol.mirror import Mirror


def test_lane_stream_mirror_equals_producer() -> None:
    data = build_log(64 * 1024, seed=3)
    stream = lane_stream(data, flushes=12, window=8_192)
    mirror = Mirror()
    last_text = None
    for line in stream["lines"]:
        params = msgspec.json.decode(line)["params"]
        mirror.feed(params["seq"], params["ops"])  # raises MirrorBroken on a gap or bad batch
        tool = mirror.value["tools"].get(CALL_ID)
        if tool is not None:
            last_text = tool["output"]["content"][0]["text"]
    assert mirror.value == stream["value"]
    assert last_text == stream["window"]
    assert len(stream["window"].encode()) <= 8_192
    assert data.decode().endswith(stream["window"])
    assert stream["lines"][0].count(b'"r"') == 1  # the base batch comes first


def test_wire_efficiency_quick() -> None:
    r = wire_efficiency(size=64 * 1024, flushes=10, window=16_384, line_rate_lines=100)
    assert r["output_bytes"] == 64 * 1024
    assert r["wire_bytes"] > 0 and r["snapshot_bytes"] > r["wire_bytes"]
    for codec in (r["codec"], r["codec_line_rate"]):
        assert 0 < codec["wire_bytes"] <= codec["inline_bytes"]
        assert codec["payload_bytes"] <= codec["wire_bytes"]


def test_microbench_quick() -> None:
    r = microbench(lines=200, window=4_096, min_seconds=0.0)
    assert r["batches"] > 100
    assert set(r["rates"]) == {"produce", "encode", "decode", "apply"}
    assert all(rate > 0 for rate in r["rates"].values())


def test_host_bench_build_log_is_mixed_and_deterministic() -> None:
    from bench.host import build_log

    data = build_log(1 << 20)
    assert len(data) == 1 << 20 and data == build_log(1 << 20)
    text = data.decode("utf-8", "replace")
    assert "\r" in text and "\x1b[" in text and "‘" in text and "✓" in text
    assert 50 < len(data) / data.count(b"\n") < 400  # lines of a build, not one blob


def test_host_bench_throughput_smoke(capsys) -> None:
    """The real daemon, host and 3 mirrors on every source (the bench checks the totals and
    every mirror's window itself, and raises on a difference); figures are not asserted."""
    from bench import host

    assert host.main(["--only", "throughput", "--size-mib", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for which in ("seq", "base64", "buildlog"):
        assert f"throughput {which}: 2 MiB" in out
        assert f"{which} daemon+host CPU-s/GiB" in out
    assert "median [min..max]" in out


def test_hostpath_bench_quick(capsys) -> None:
    """Every write-path variant moves every byte and counts every line (the bench checks each
    run against ``bytes.count`` of the source and raises on a difference)."""
    from bench import hostpath

    assert hostpath.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for variant in ("host", "readv", "splice", "nocount"):
        assert f"seq       {variant}" in out and f"buildlog  {variant}" in out


def test_microbench_counts_the_producers_diff() -> None:
    r = microbench(lines=200, window=4_096, min_seconds=0.0)
    assert 0 < r["produce_us_per_batch"] < r["us_per_batch"]


def test_lanes_quick(capsys) -> None:
    """``bench.lanes --quick`` against a real daemon: both benches run and print figures."""
    from bench import lanes

    assert lanes.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out
    assert "  1 calls: dshd p50" in out and " 10 calls: dshd p50" in out
    assert "big batch" in out and "1 MiB argument" in out


def test_soak_quick(capsys) -> None:
    """bench.soak --quick: a real daemon, real clients; the printout has its figures and the
    work it did (rounds > 0), and the arithmetic of the verdict is the goal's."""
    from bench import QUICK_ARGV, soak

    assert soak.main(QUICK_ARGV["soak"]) == 0
    out = capsys.readouterr().out
    assert "SHORT soak" in out and "baseline (idle daemon, same run)" in out
    assert " 0 rounds" not in out and "goal: flat within +-20 % after warm-up" in out
    r = soak.report([(0, 100), (10, 100), (20, 121), (30, 110)], 50, warmup=10)
    assert r["warmup_kib"] == 100 and r["max_kib"] == 121 and not r["met"]
    assert soak.report([(10, 100_000), (20, 100_000), (30, 100_001)], 50, warmup=10)["met"]
    # a slow leak that a short soak measures within 20 % fails by its trend
    leak = soak.report([(10, 100), (20, 105), (30, 110)], 50, warmup=10)
    assert leak["max_deviation_percent"] == 10 and not leak["met"]


def test_requests_bench_quick(capsys) -> None:
    """bench/requests.py --quick against a real daemon: every figure is printed with its
    baseline and its goal verdict (correctness of the output only, never time)."""
    from bench import requests

    assert requests.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for needle in ("daemon.status: daemon CPU", "bare trio line server", "`true` call: daemon CPU",
                   "call host's own", "durable events/s", "bare os.write+os.fsync",
                   "python3 -c pass", 'python3 -c "import trio"', "dsh --version",
                   "dsh run -- true"):
        assert needle in out, (needle, out)
    assert out.count("goal ") == 5, out


def test_hostwake_quick(capsys) -> None:
    """``bench.hostwake --quick``: a real host at 100 lines/s beside the bare loop's floor (the
    bench checks the call's line count and raises on a difference); figures not asserted."""
    from bench import hostwake

    assert hostwake.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "host CPU per line:" in out and "floor (a bare epoll/read/write/send loop)" in out
