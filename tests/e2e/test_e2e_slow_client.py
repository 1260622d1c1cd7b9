"""Slow readers never cost anybody else (PROTOCOL.md §1, OPS.md §4; issue 6 must-show):
a client that stops reading for 10 s while tens of MB stream leaves the daemon's memory bounded, the other
clients' mirrors correct, and is itself resynced by a base batch when it reads again."""

from __future__ import annotations

import json
import socket

import pytest
import trio

from client.api import connect
from protocol.mirror import Mirror

from .conftest import running_daemon

#: Non-repetitive output (so every publish really changes the window) until a stop file appears.
ENDLESS_OUTPUT = "n=0; while [ ! -e stop ]; do seq $n $((n+200000)); n=$((n+200001)); done"
STALL_SECONDS = 10


@pytest.fixture
def small_queue_daemon():
    """A daemon whose per-connection stream budget is 256 KiB, so a 10 s stall overflows it
    (the lane is paced to ~256 KiB/s per session, EXEC.md §2)."""
    with running_daemon("send_queue_stream_bytes = 262144\n", prefix="dsh-slow-") as d:
        yield d


class StalledClient:
    """A raw subscriber that can stop reading on demand (its socket buffers fill up)."""

    def __init__(self, path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        # Small kernel buffers, so that not reading really stalls the daemon's writer.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.mirror = Mirror()
        self.bases = 0
        self.batches = 0

    def send(self, obj) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def read(self) -> dict:
        return json.loads(self.file.readline())

    def subscribe(self, sid: str) -> str:
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": 1, "client": {"name": "stalled"}}})
        assert "result" in self.read()
        self.send({"jsonrpc": "2.0", "id": 2, "method": "subscribe", "params": {"sessionId": sid}})
        return self.read()["result"]["subscriptionId"]

    def read_batch(self) -> None:
        msg = self.read()
        assert msg["method"] == "stream"
        p = msg["params"]
        self.mirror.feed(p["seq"], p["ops"])  # raises on a seq gap or a bad batch
        self.batches += 1
        if p["ops"] and p["ops"][0][0] == "r":
            self.bases += 1

    def close(self) -> None:
        self.file.close()
        self.sock.close()


async def test_stalled_client_is_resynced_and_costs_nobody_else(small_queue_daemon, workdir):
    daemon = small_queue_daemon
    async with connect(daemon.socket, "runner") as runner, connect(daemon.socket, "fast") as fast:
        sid = await runner.create_session(str(workdir))
        stalled = StalledClient(daemon.socket)
        stalled.subscribe(sid)
        stalled.read_batch()  # the first base batch
        assert stalled.bases == 1
        sub = await fast.subscribe(sid)
        await sub.next_view()
        call_id = await runner.run_tool(sid, ENDLESS_OUTPUT, approved=True)
        # The fast client follows the run while the stalled one reads nothing: for at least
        # STALL_SECONDS, and until the daemon has dropped batches for it (bounded).
        totals: list[int] = []
        stall_over = trio.current_time() + STALL_SECONDS

        async def follow() -> None:
            async for view in sub:
                tool = view["tools"].get(call_id)
                if tool is not None:
                    totals.append(tool["output"]["truncation"]["totalBytes"])
                if any(r["callId"] == call_id for r in view["recent"]):
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            with trio.fail_after(STALL_SECONDS + 60):
                while True:
                    await trio.sleep(0.5)
                    dropped = (await runner.status())["droppedBatches"]
                    if dropped > 0 and trio.current_time() >= stall_over:
                        break
            (workdir / "stop").touch()
        result = await runner.wait(sid, call_id)
        streamed = result["details"]["truncation"]["totalBytes"]
        print(f"streamed {streamed / 1e6:.0f} MB while one client stalled; dropped {dropped} batches")
        assert streamed > 50_000_000
        assert totals == sorted(totals) and len(totals) > 10
        peak_mib = daemon.peak_rss_kib() / 1024
        print(f"dshd peak RSS with a stalled client: {peak_mib:.1f} MiB")
        assert peak_mib < 100, peak_mib
        daemon_view = sub.mirror.value

        # The stalled client reads again: everything it gets applies cleanly (no seq gap),
        # and it is resynced by a fresh base batch to the daemon's current view.
        def catch_up() -> None:
            while stalled.mirror.value != daemon_view:
                stalled.read_batch()

        with trio.fail_after(60):
            await trio.to_thread.run_sync(catch_up)
        assert stalled.bases >= 2, "the overflowed subscription was not rebased"
        status = await runner.status()
        assert status["connections"] >= 3  # nobody was disconnected
        stalled.close()
