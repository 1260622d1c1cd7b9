"""Smoke test of the in-process streaming benches (``bench.wire``) in quick mode.

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
