"""In-process streaming benches: wire efficiency and the protocol microbench (no daemon).

Theory of operation: :func:`lane_stream` replays what a session's publisher does for one tool
call, with the daemon's own pieces and no I/O: a build log is cut into chunks (pipe reads) and
fed to a real ``OutputCapture`` (50 KB window); after each group of chunks the lane ``Tracker``
is updated the way ``Session._sync_captures`` does it (``set_text`` of the window, ``set`` of
the truncation dict, the spill path once), flushed, and every batch is encoded by a
per-subscriber ``Encoder`` into the same notification line ``Subscription._offer`` sends. The
call enters the lane (``tools``) and leaves it (``recent``) as in ``Session``. The result is
the list of Op batches, the wire batches and the notification lines, plus the producer's final
value, so a caller can check a mirror against it.

* :func:`wire_efficiency`: total notification bytes vs the command's output bytes; vs a
  snapshot-per-flush baseline (``["r", view]`` every flush, same envelope); and the codec's
  savings vs the same batches with inline paths and no shortening (Op form), on the delta
  batches (the hot path), counted three ways (all bytes; the bytes that are not text payload;
  and a line-rate stream, one flush per line, where structure dominates).
* :func:`microbench`: ops/s of ``Tracker`` (produce: the producer's diff), ``Encoder.encode``,
  ``Decoder.decode`` and ``apply`` on a rolling-window line-rate stream; per batch, all four
  together next to a snapshot baseline (msgspec JSON encode + decode of the whole ToolOutput
  per batch, what a snapshot protocol pays).

Both check correctness (a fresh mirror fed every wire batch equals the producer's value) and
raise ``AssertionError`` when it does not; they never assert on time.
"""

from __future__ import annotations

import random
import time
from typing import Any

import msgspec

from dshd.execution.capture import OutputCapture, ShellOutputLimits
from protocol.apply import apply
from protocol.codec import Decoder, Encoder
from protocol.tracker import Tracker

__all__ = ["build_log", "lane_stream", "wire_efficiency", "microbench"]

_json = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()

CALL_ID = "c-3f9a1c2e7b40"
SUB_ID = "s-8d2e41a07c55"


def build_log(size: int, seed: int = 6) -> bytes:
    """``size`` bytes of a plausible, non-repetitive C/C++ build log (ASCII, ~70 B lines)."""
    rng = random.Random(seed)
    dirs = ["src/core", "src/net", "src/storage", "lib/util", "src/ui/widgets", "third_party/zstd"]
    stems = ["buffer", "parser", "session", "socket", "writer", "reader", "index", "cache",
             "config", "token", "stream", "frame", "pool", "queue", "codec", "hash"]
    out: list[str] = []
    n = 0
    step = 0
    while n < size:
        step += 1
        d, s = rng.choice(dirs), rng.choice(stems)
        pct = min(100, step * 100 // max(1, size // 70))
        r = rng.random()
        if r < 0.62:
            line = f"[{pct:3d}%] Building CXX object {d}/CMakeFiles/{s}.dir/{s}_{step}.cc.o\n"
        elif r < 0.80:
            line = (f"g++ -O2 -g -Wall -Wextra -I{d} -Iinclude -c {d}/{s}_{step}.cc "
                    f"-o build/{d}/{s}_{step}.o\n")
        elif r < 0.93:
            line = (f"{d}/{s}_{step}.cc:{rng.randint(1, 2000)}:{rng.randint(1, 80)}: warning: "
                    f"unused variable '{s[:3]}{rng.randint(0, 99)}' [-Wunused-variable]\n")
        else:
            line = f"[{pct:3d}%] Linking CXX static library lib{s}_{step % 97}.a\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()[:size]


def _notification(seq: int, wire: list) -> bytes:
    return _json.encode({"jsonrpc": "2.0", "method": "stream",
                         "params": {"subscriptionId": SUB_ID, "seq": seq, "ops": wire}}) + b"\n"


def _lane() -> dict:
    return {
        "session": {"sessionId": "s-bench", "title": "bench", "cwd": "/tmp/bench",
                    "approvalPolicy": "ask", "sandbox": "workspace-write"},
        "tools": {}, "approvals": {}, "recent": [], "turn": None,
    }


def lane_stream(data: bytes, *, flushes: int, reads: int | None = None,
                window: int = 51_200, max_lines: int = 2_000) -> dict:
    """Replay one call's output through capture → tracker → encoder (see the module doc).

    ``data`` is cut into ``reads`` equal pipe reads (default: one per flush, at most 64 KiB
    each), grouped into ``flushes`` publishes. Returns ``{"ops", "wire", "lines", "value",
    "snapshots", "output_bytes"}``: per batch the Op form, the wire form and the notification
    line; the producer's final value; and per batch the notification line a snapshot-per-flush
    protocol would send (``["r", view]``).
    """
    limits = ShellOutputLimits(max_bytes=window, max_lines=max_lines)
    cap = OutputCapture(limits, None)
    tracker = Tracker(_lane())
    encoder = Encoder()
    out: dict[str, Any] = {"ops": [], "wire": [], "lines": [], "snapshots": [],
                           "output_bytes": len(data)}
    seq = 0

    def publish() -> None:
        nonlocal seq
        ops = tracker.flush()
        if not ops:
            return
        wire = encoder.encode(ops)
        out["ops"].append(ops)
        out["wire"].append(wire)
        out["lines"].append(_notification(seq, wire))
        out["snapshots"].append(_notification(seq, [["r", tracker.value]]))
        seq += 1

    publish()  # the subscriber's base batch: the lane before the call
    tracker.set(["tools", CALL_ID], {"name": "bash", "args": {"command": "make -j2"},
                                     "state": "running", "startedAt": 1_700_000_000_000,
                                     "output": cap.tool_output()})
    publish()
    base = ["tools", CALL_ID, "output"]
    if reads is None:
        reads = max(flushes, -(-len(data) // 65536))
    per_read = -(-len(data) // reads)
    chunks = [data[i:i + per_read] for i in range(0, len(data), per_read)]
    group = -(-len(chunks) // flushes)
    synced_spill = False
    for g in range(0, len(chunks), group):
        for chunk in chunks[g:g + group]:
            cap.feed(chunk)
        # Session._sync_captures, verbatim in effect.
        tracker.set_text(base + ["content", 0, "text"], cap.text)
        tracker.set(base + ["truncation"], dict(cap.truncation))
        t = cap.truncation
        if not synced_spill and (t["truncated"] or t["totalBytes"] > window
                                 or t["totalLines"] > max_lines):  # when spilling starts
            tracker.set(base + ["details", "spillPath"], "/tmp/bench/spill/" + CALL_ID + ".log")
            synced_spill = True
        publish()
    cap.finish()
    tracker.set_text(base + ["content", 0, "text"], cap.text)
    tracker.set(base + ["truncation"], dict(cap.truncation))
    publish()  # the final state, before the call leaves the lane
    tracker.delete(["tools", CALL_ID])
    tracker.insert(["recent"], 0, {"callId": CALL_ID, "name": "bash", "isError": False,
                                   "exitCode": 0, "errorCode": None})
    publish()
    out["value"] = tracker.value
    out["window"] = cap.text
    return out


def mirror_check(stream: dict) -> None:
    """A fresh client (JSON decode → codec decode → apply) ends equal to the producer."""
    decoder, value = Decoder(), None
    last_text = None
    for line in stream["lines"]:
        msg = _dec.decode(line)
        ops = decoder.decode(msg["params"]["ops"])
        value = apply(value, ops)
        tool = value["tools"].get(CALL_ID)
        if tool is not None:
            last_text = tool["output"]["content"][0]["text"]
    assert value == stream["value"], "mirror differs from the producer's value"
    assert last_text == stream["window"], "mirror's last window differs from the capture's"


def _payload_bytes(ops: list) -> int:
    """JSON bytes of the text payloads (``a`` text, ``s`` of a string) of Op-form ops."""
    n = 0
    for op in ops:
        v = op[-1]
        if op[0] in ("a", "s") and type(v) is str:
            n += len(_json.encode(v))
    return n


def _codec_savings(stream: dict) -> dict:
    """Codec wire vs Op form (inline paths, no shortening) over the delta batches."""
    inline = wire = payload = 0
    for ops, w in zip(stream["ops"], stream["wire"]):
        if ops and ops[0][0] == "r":
            continue
        inline += len(_json.encode(ops))
        wire += len(_json.encode(w))
        payload += _payload_bytes(ops)
    return {
        "inline_bytes": inline,
        "wire_bytes": wire,
        "payload_bytes": payload,
        "savings": 1 - wire / inline if inline else 0.0,
        "structure_inline": inline - payload,
        "structure_wire": wire - payload,
        "structure_savings": 1 - (wire - payload) / (inline - payload) if inline > payload else 0.0,
    }


def wire_efficiency(*, size: int = 256 * 1024, flushes: int = 20, window: int = 51_200,
                    line_rate_lines: int = 1000, seed: int = 6) -> dict:
    """The wire-efficiency figures (see the module doc); checks the mirrors first."""
    data = build_log(size, seed)
    stream = lane_stream(data, flushes=flushes, window=window)
    mirror_check(stream)
    wire_bytes = sum(len(x) for x in stream["lines"])
    snap_bytes = sum(len(x) for x in stream["snapshots"])
    # The line-rate hot path: the same log, one flush per line (what `tail -f` of a slow build
    # or the latency bench streams); only its first ``line_rate_lines`` lines.
    lines = data.split(b"\n")[:line_rate_lines]
    small = b"\n".join(lines) + b"\n"
    line_stream = lane_stream(small, flushes=len(lines), reads=len(lines), window=window)
    mirror_check(line_stream)
    return {
        "output_bytes": len(data),
        "flushes": flushes,
        "batches": len(stream["lines"]),
        "wire_bytes": wire_bytes,
        "wire_ratio": wire_bytes / len(data),
        "snapshot_bytes": snap_bytes,
        "snapshot_ratio": snap_bytes / len(data),
        "codec": _codec_savings(stream),
        "codec_line_rate": _codec_savings(line_stream),
        "line_rate_wire_ratio": sum(len(x) for x in line_stream["lines"]) / len(small),
    }


def _rate(fn, batches: list, ops_count: int, min_seconds: float) -> tuple[float, int]:
    """ops/s of ``fn(batch)`` over every batch, repeated until ``min_seconds`` have passed."""
    rounds = 0
    t0 = time.perf_counter()
    while True:
        for b in batches:
            fn(b)
        rounds += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return ops_count * rounds / elapsed, rounds


def microbench(*, lines: int = 4000, window: int = 51_200, min_seconds: float = 0.5,
               seed: int = 7) -> dict:
    """ops/s of produce / encode / decode / apply on a rolling-window line-rate stream."""
    data = build_log(lines * 72, seed)
    data = b"\n".join(data.split(b"\n")[:lines]) + b"\n"
    stream = lane_stream(data, flushes=lines, reads=lines, window=window)
    mirror_check(stream)
    # Only the steady state: the deltas after the window is full (t + a + s + s).
    deltas = [ops for ops in stream["ops"][2:-2]]
    wires = stream["wire"]
    n_ops = sum(len(b) for b in deltas)
    n_batches = len(deltas)

    def encode_all(_: object) -> None:
        enc = Encoder()
        for ops in stream["ops"]:
            enc.encode(ops)

    def decode_all(_: object) -> None:
        dec = Decoder()
        for w in wires:
            dec.decode(w)

    decoded = []
    dec = Decoder()
    for w in wires:
        decoded.append(dec.decode(w))

    def apply_all(_: object) -> None:
        value = None
        for ops in decoded:
            value = apply(value, ops)

    total_ops = sum(len(b) for b in stream["ops"])
    # Producer side: the tracker work per publish (set_text + set(truncation) + flush).
    limits = ShellOutputLimits(max_bytes=window, max_lines=2000)
    cap = OutputCapture(limits, None)
    states = []
    for ln in data.split(b"\n")[:-1]:
        cap.feed(ln + b"\n")
        states.append((cap.text, dict(cap.truncation)))
    path_text = ["tools", CALL_ID, "output", "content", 0, "text"]
    path_trunc = ["tools", CALL_ID, "output", "truncation"]
    produced = [0]

    def produce_all(_: object) -> None:
        tr = Tracker(_lane())
        tr.set(["tools", CALL_ID], {"name": "bash", "args": {}, "state": "running",
                                    "startedAt": 0, "output": OutputCapture(limits, None).tool_output()})
        tr.flush()
        k = 0
        for text, trunc in states:
            tr.set_text(path_text, text)
            tr.set(path_trunc, trunc)
            k += len(tr.flush())
        produced[0] = k

    produce_all(None)
    produce_ops = produced[0]
    snap_values = [{"content": [{"type": "text", "text": t}], "details": {}, "truncation": tr}
                   for t, tr in states]

    def snapshot_all(_: object) -> None:
        for v in snap_values:
            _dec.decode(_json.encode(v))

    results = {}
    for name, fn, count in (("produce", produce_all, produce_ops), ("encode", encode_all, total_ops),
                            ("decode", decode_all, total_ops), ("apply", apply_all, total_ops)):
        rate, _ = _rate(fn, [None], count, min_seconds)
        results[name] = rate
    snap_rate, _ = _rate(snapshot_all, [None], len(snap_values), min_seconds)
    per_batch_ops = total_ops / len(stream["ops"])
    # Seconds per batch, ours (the producer's diff -- set_text + set + flush on the tracker --
    # then encode + decode + apply: the per-subscriber and per-client work) vs a snapshot
    # protocol (encode + decode of the whole ToolOutput).
    produce_per_batch = produce_ops / len(states) / results["produce"]
    ours = produce_per_batch + sum(per_batch_ops / results[k] for k in ("encode", "decode", "apply"))
    snap = 1 / snap_rate
    return {
        "batches": len(stream["ops"]),
        "steady_batches": n_batches,
        "ops_per_batch": n_ops / max(1, n_batches),
        "window_chars": limits.max_bytes,
        "rates": results,
        "snapshot_batches_per_s": snap_rate,
        "us_per_batch": ours * 1e6,
        "produce_us_per_batch": produce_per_batch * 1e6,
        "snapshot_us_per_batch": snap * 1e6,
        "ratio": ours / snap,
    }
