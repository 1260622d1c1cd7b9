"""The lane publisher's pacing (EXEC.md §2), through a real daemon over memory streams.

A call's output is a *bulk* change: a paced publish carries it, and a big batch (more than
``SMALL_BATCH_BYTES`` of encoded wire bytes) holds the next paced publish back by its size at
``publish_rate_bytes``. A call settling, entering the lane or changing state is a *control*
change: it goes out at once whatever that byte pause says. The rate is set to its minimum
(1 KiB/s) so that a ~160 KB batch pauses the lane's output for ~160 virtual seconds, far
longer than anything else here takes: virtual time, on the autojump clock, says which batch
waited for what. The output comes from ``cat`` fed by ``tool.write`` (no real command races
a virtual deadline).
"""

from __future__ import annotations

import base64
import json

import pytest
import trio

from dshd.sessions.streams import SMALL_BATCH_BYTES

RATE = 1024
BIG = (b"y" * 99 + b"\n") * 1600  # 160,000 bytes (the window, output_max_bytes, holds 256 KiB)


@pytest.fixture
def daemon_overrides() -> dict:
    return {"publish_rate_bytes": RATE, "output_max_bytes": 256 * 1024,
            "output_max_lines": 100_000}


async def _pipe_call(wire, sid: str, command: str) -> str:
    result = await wire.call("tool.run", {
        "sessionId": sid, "name": "bash", "approved": True,
        "arguments": {"command": command, "stdin": "pipe"}})
    return result["callId"]


async def _write(wire, sid: str, cid: str, data: bytes) -> None:
    await wire.call("tool.write", {"sessionId": sid, "callId": cid,
                                   "data": base64.b64encode(data).decode()})


def _total(lane, cid: str) -> int:
    tool = lane.tool(cid)
    return tool["output"]["truncation"]["totalBytes"] if tool else -1


def _last_line(wire) -> int:
    """Bytes of the last stream line read (its JSON re-encoded compactly)."""
    last = [m for m in wire.received if isinstance(m, dict) and m.get("method") == "stream"][-1]
    return len(json.dumps(last, separators=(",", ":"))) + 1


async def _big_batch(daemon, nursery):
    """A session with ``cat`` calls A (echoes) and B (swallows), and a mirror whose last batch
    was a big one of A's output: returns (wire, sid, lane, a, b, the virtual time it came, its
    byte pause). (A write may reach the lane in two publishes; if the second was small, A
    writes again.)"""
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    lane = await wire.subscribe(sid)
    a = await _pipe_call(wire, sid, "cat")
    b = await _pipe_call(wire, sid, "cat >/dev/null")
    await wire.wait_lane(lane, lambda ln: ln.tool(a) and ln.tool(b), "both calls in the lane")
    total = 0
    for _ in range(3):
        await _write(wire, sid, a, BIG)
        total += len(BIG)
        await wire.wait_lane(lane, lambda ln: _total(ln, a) == total, "A's big output")
        if _last_line(wire) > 10 * SMALL_BATCH_BYTES:  # a pause of more than 40 s
            return wire, sid, lane, a, b, trio.current_time(), _last_line(wire) / RATE
    raise AssertionError("A's output never came as one big batch")


async def _finish(wire, sid: str, *cids: str) -> None:
    for cid in cids:
        await wire.call("tool.closeStdin", {"sessionId": sid, "callId": cid})
        await wire.wait(sid, cid)


async def test_a_settle_right_after_a_big_batch_goes_at_once(daemon, daemon_clock, nursery):
    wire, sid, lane, a, b, _, pause = await _big_batch(daemon, nursery)
    await wire.call("tool.closeStdin", {"sessionId": sid, "callId": b})
    result = await wire.wait(sid, b)
    answered = trio.current_time()
    assert result["exitCode"] == 0
    await wire.wait_lane(lane, lambda ln: ln.recent(b) and not ln.tool(b), "B leaving the lane")
    left = trio.current_time()
    # Not held back by A's byte pause (~160 s): B left with its tool.wait answer, or before.
    assert left - answered <= 1.0, (left - answered, pause)
    assert lane.tool(a) is not None  # A runs on
    await _finish(wire, sid, a)


async def test_the_byte_pause_still_holds_back_the_next_output(daemon, daemon_clock, nursery):
    wire, sid, lane, a, b, big_at, pause = await _big_batch(daemon, nursery)
    batches, before = lane.batches, _total(lane, a)
    await _write(wire, sid, a, b"z\n")  # a tiny write: still output, so it is paced
    await wire.wait_lane(lane, lambda ln: _total(ln, a) == before + 2, "A's next line")
    assert trio.current_time() - big_at >= 0.9 * pause, (trio.current_time() - big_at, pause)
    assert lane.batches == batches + 1  # one paced publish, nothing in between
    await _finish(wire, sid, a, b)
