"""Lossless followers against a real daemon and real call hosts (HOST.md §6; issue 12's
"Completeness"): ``tool.follow`` from 0 of a finished and of a running call, a follower that
attaches after 100,000 lines, one that disconnects for 10 s and resumes from its offset, and
one whose client reads at ~1 MB/s all end with the complete output (checksums), while the
daemon's RSS does not grow with the output; a follower behind the per-call cap gets a ``gap``
and goes on at firstOffset; followers end with their connection and with the daemon's stop."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import time

from .conftest import running_daemon
from .raw_client import (
    Collected, RawWire, collect, follow, run, seq_bytes, session, vm_rss_kib, wait,
    wait_end_offset, wait_output,
)


def test_follow_from_zero_of_a_finished_call(daemon, workdir):
    w = RawWire(daemon.socket)
    sid = session(w, workdir)
    call_id = run(w, sid, "seq 1 200000; exit 3")
    assert wait(w, sid, call_id)["exitCode"] == 3
    got = collect(w, follow(w, sid, call_id))
    assert bytes(got.data) == seq_bytes(1, 200000)
    assert got.end == {"followId": got.end["followId"], "offset": len(got.data), "eof": True,
                       "exitCode": 3}
    assert not got.gaps and not w.outputs
    w.close()


def test_follow_from_zero_of_a_running_call(daemon, workdir):
    w = RawWire(daemon.socket)
    sid = session(w, workdir)
    call_id = run(w, sid, "for i in $(seq 1 50); do seq $((i*10000)) $((i*10000+9999)); "
                          "sleep 0.02; done")
    follow_id = follow(w, sid, call_id)
    got = collect(w, follow_id)
    expected = b"".join(seq_bytes(i * 10000, i * 10000 + 9999) for i in range(1, 51))
    assert hashlib.sha256(got.data).digest() == hashlib.sha256(expected).digest()
    assert got.end["eof"] is True and got.end["exitCode"] == 0
    assert got.notes > 2  # it followed live, not one read at the end
    # The follower is gone once it ended: unfollow names it unknown.
    assert w.error("tool.unfollow", {"followId": follow_id})["code"] == -32602
    w.close()


def test_a_follower_attaching_after_100000_lines_gets_everything(daemon, workdir):
    w = RawWire(daemon.socket)
    sid = session(w, workdir)
    call_id = run(w, sid, "seq 1 100000; while [ ! -e go ]; do sleep 0.05; done; "
                          "seq 100001 150000")
    first = seq_bytes(1, 100000)
    wait_end_offset(w, sid, call_id, len(first))
    follow_id = follow(w, sid, call_id)
    (workdir / "go").touch()
    got = collect(w, follow_id)
    assert bytes(got.data) == seq_bytes(1, 150000)
    assert got.end["eof"] is True and got.end["exitCode"] == 0
    w.close()


def test_a_follower_that_disconnects_for_10_s_resumes_from_its_offset(daemon, workdir):
    w = RawWire(daemon.socket)
    sid = session(w, workdir)
    call_id = run(w, sid, "for i in $(seq 0 199); do seq $((i*20000)) $((i*20000+19999)); "
                          "sleep 0.1; done")
    expected = b"".join(seq_bytes(i * 20000, i * 20000 + 19999) for i in range(200))
    follow_id = follow(w, sid, call_id)
    got = collect_some(w, follow_id, 1_000_000)
    w.close()  # gone mid-stream, for 10 s, while the call goes on
    time.sleep(10)
    w = RawWire(daemon.socket)
    rest = collect(w, follow(w, sid, call_id, got.offset), got.offset)
    assert got.offset < len(expected)
    assert bytes(got.data) + bytes(rest.data) == expected
    assert rest.end["eof"] is True and rest.end["exitCode"] == 0
    w.close()


def collect_some(w: RawWire, follow_id: str, at_least: int):
    got = Collected(0)
    while got.offset < at_least:
        note = w.next_output()
        assert note["followId"] == follow_id
        got.feed(note)
        assert got.end is None
    return got


class SlowReader:
    """A raw follower whose client reads its socket at ``rate`` bytes/s (small kernel
    buffers, so the daemon's writer really waits) until told to read at full speed."""

    def __init__(self, path, rate: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        self.sock.connect(str(path))
        self.sock.settimeout(120)
        self.rate = rate
        self.buf = bytearray()
        self.read_total = 0

    def send(self, obj) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def line(self) -> dict:
        while b"\n" not in self.buf:
            started = time.monotonic()
            data = self.sock.recv(16384)
            assert data, "connection closed"
            self.buf += data
            self.read_total += len(data)
            if self.rate:
                time.sleep(max(0.0, len(data) / self.rate - (time.monotonic() - started)))
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return json.loads(line)

    def answer(self, rid: int) -> dict:
        while True:
            msg = self.line()
            if msg.get("id") == rid:
                return msg


def test_a_slow_reader_gets_everything_and_the_daemon_stays_small(workdir):
    """~214 MB of output; the client reads ~1 MB/s for 20 s: the daemon's VmRSS does not grow
    with what the command wrote meanwhile (the follower waits; the bytes stay on disk);
    then it reads at full speed and gets every byte (checksum)."""
    n = 25_000_000
    expected = hashlib.sha256()
    size = 0
    for start in range(1, n + 1, 1_000_000):
        chunk = seq_bytes(start, min(n, start + 999_999))
        expected.update(chunk)
        size += len(chunk)
    with running_daemon(prefix="dsh-raw-slow-") as d:
        w = RawWire(d.socket)
        sid = session(w, workdir)
        call_id = run(w, sid, f"seq 1 {n}")
        reader = SlowReader(d.socket, rate=1_000_000)
        reader.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"protocolVersion": 1}})
        assert "result" in reader.answer(1)
        reader.send({"jsonrpc": "2.0", "id": 2, "method": "tool.follow",
                     "params": {"sessionId": sid, "callId": call_id, "offset": 0}})
        follow_id = reader.answer(2)["result"]["followId"]
        baseline = vm_rss_kib(d.pid)  # before the follower sent anything
        sha = hashlib.sha256()
        offset = 0
        samples = []
        slow_until = time.monotonic() + 20
        end = None
        while end is None:
            if reader.rate and time.monotonic() > slow_until:
                reader.rate = 0  # full speed from now on
            msg = reader.line()
            p = msg["params"]
            assert msg["method"] == "output" and p["followId"] == follow_id
            assert p["offset"] == offset and "gap" not in p
            if p.get("eof"):
                end = p
                break
            chunk = base64.b64decode(p["data"])
            sha.update(chunk)
            offset += len(chunk)
            if reader.rate:
                samples.append((time.monotonic(), vm_rss_kib(d.pid), offset))
        written = w.result("tool.read", {"sessionId": sid, "callId": call_id, "offset": 0,
                                         "limit": 0})["endOffset"]
        growth_mib = (max(s[1] for s in samples) - baseline) / 1024
        read_slowly = samples[-1][2]
        print(f"slow phase: read {read_slowly / 1e6:.1f} MB in 20 s; the command wrote "
              f"{written / 1e6:.0f} MB; daemon VmRSS {baseline / 1024:.1f} MiB at the start, "
              f"max growth {growth_mib:.1f} MiB")
        assert read_slowly < 60_000_000  # it really was slow: ~1 MB/s
        assert growth_mib < 32, samples[-5:]
        assert end["eof"] is True and end["exitCode"] == 0 and end["offset"] == size
        assert offset == size and sha.digest() == expected.digest()
        w.close()


def test_a_follower_behind_the_cap_gets_a_gap_and_goes_on(workdir):
    with running_daemon("spill_max_bytes = 65536\n", prefix="dsh-raw-gap-") as d:
        w = RawWire(d.socket)
        sid = session(w, workdir)
        call_id = run(w, sid, "seq 1 100000")
        wait(w, sid, call_id)
        expected = seq_bytes(1, 100000)
        got = collect(w, follow(w, sid, call_id, 0))
        assert len(got.gaps) == 1 and got.gaps[0]["from"] == 0
        first = got.gaps[0]["to"]
        assert 0 < first and len(expected) - first <= 65536
        assert bytes(got.data) == expected[first:]
        assert got.end["eof"] is True and got.end["offset"] == len(expected)
        w.close()


def test_a_slow_follower_falls_behind_the_cap_mid_stream_and_goes_on(workdir):
    """The disk cap drops segments while a paused follower lags (a 4 KiB follower budget, a
    client reading ~300 KB/s): it gets gaps mid-stream, each continuing at the then
    firstOffset, every byte it does get is the command's at its offset, and it ends at the
    end with eof."""
    config = "spill_max_bytes = 65536\nsend_queue_stream_bytes = 4096\n"
    with running_daemon(config, prefix="dsh-raw-gap2-") as d:
        w = RawWire(d.socket)
        sid = session(w, workdir)
        whole = seq_bytes(1, 20000) * 40
        call_id = run(w, sid, "for i in $(seq 1 40); do seq 1 20000; sleep 0.05; done")
        reader = SlowReader(d.socket, rate=300_000)
        reader.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"protocolVersion": 1}})
        assert "result" in reader.answer(1)
        reader.send({"jsonrpc": "2.0", "id": 2, "method": "tool.follow",
                     "params": {"sessionId": sid, "callId": call_id, "offset": 0}})
        follow_id = reader.answer(2)["result"]["followId"]
        got = Collected(0, whole)
        got.keep = False
        while got.end is None:
            msg = reader.line()
            assert msg["method"] == "output" and msg["params"]["followId"] == follow_id
            got.feed(msg["params"])
        assert got.end["eof"] is True and got.end["offset"] == len(whole)
        assert any(gap["from"] > 0 for gap in got.gaps), got.gaps
        for gap in got.gaps:
            assert gap["to"] > gap["from"] and gap["to"] % (65536 // 4) == 0, gap
        w.close()


def test_followers_end_with_their_connection_and_with_the_daemon_stop(workdir):
    with running_daemon(prefix="dsh-raw-stop-") as d:
        w = RawWire(d.socket)
        sid = session(w, workdir)
        call_id = run(w, sid, "echo started; sleep 600")
        wait_output(w, sid, call_id, b"started")
        # Many followers on one connection that closes: the daemon forgets them.
        for _ in range(20):
            follow(w, sid, call_id)
        w.close()
        w = RawWire(d.socket)
        follow_id = follow(w, sid, call_id)
        note = w.next_output()
        assert note == {"followId": follow_id, "offset": 0,
                        "data": base64.b64encode(b"started\n").decode()}
        deadline = time.monotonic() + 10
        while w.result("daemon.status")["connections"] != 1:  # the closed one is forgotten
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        d.proc.terminate()  # a graceful stop: the follower must not hold it up
        d.proc.wait(timeout=30)
        assert time.monotonic() - started < 15  # stop_timeout_seconds (10) + slack: liveness
        while line := w.file.readline():  # the connection closed (after, maybe, the eof)
            note = json.loads(line)["params"]
            assert note["followId"] == follow_id and note.get("eof") is True, note
        w.close()


def test_pipelined_follows_cannot_pass_the_per_connection_bound(daemon, workdir):
    """1,000 tool.follow requests in one batch on one connection: at most 256 followers get
    in, the rest are -32013 (before: all passed the bound's check while the others awaited
    the session)."""
    w = RawWire(daemon.socket)
    try:
        sid = session(w, workdir)
        call_id = run(w, sid, "sleep 30")
        # One JSON-RPC batch: its members run concurrently (a batch is one request in flight).
        batch = [{"jsonrpc": "2.0", "id": 5000 + i, "method": "tool.follow",
                  "params": {"sessionId": sid, "callId": call_id}} for i in range(1000)]
        w.sock.sendall(json.dumps(batch).encode() + b"\n")
        while True:
            msg = w._read()
            if isinstance(msg, list):
                break
        ok = sum(1 for m in msg if "result" in m)
        refused = sum(1 for m in msg if m.get("error", {}).get("code") == -32013)
        assert ok == 256 and refused == 744, (ok, refused)
        w.result("tool.cancel", {"sessionId": sid, "callId": call_id})
    finally:
        w.close()


def test_many_followers_on_one_connection_all_finish(daemon, workdir):
    """16 followers of one 2,000,000-byte call on one connection fill the follower budget
    (16 x 256 KiB chunks > 4 MiB): every one must still get all its bytes and its eof (before:
    each waiter replaced the one wake-up Event, so all but the last waiter slept forever and
    the connection stalled at 34 of 64 notifications)."""
    w = RawWire(daemon.socket, timeout=60)  # the liveness bound
    try:
        sid = session(w, workdir)
        call_id = run(w, sid, "head -c 2000000 /dev/urandom > blob; cat blob")
        wait(w, sid, call_id)
        expected = (workdir / "blob").read_bytes()
        batch = [{"jsonrpc": "2.0", "id": 7000 + i, "method": "tool.follow",
                  "params": {"sessionId": sid, "callId": call_id}} for i in range(16)]
        w.sock.sendall(json.dumps(batch).encode() + b"\n")  # all start at once
        while True:
            answer = w._read()
            if isinstance(answer, list):
                break
        ids = [a["result"]["followId"] for a in answer]
        got = {i: bytearray() for i in ids}
        ended: set[str] = set()
        while len(ended) < len(ids):
            note = w.next_output()
            fid = note["followId"]
            if note.get("eof"):
                ended.add(fid)
            elif "data" in note:
                assert note["offset"] == len(got[fid]), note
                got[fid] += base64.b64decode(note["data"])
        assert all(bytes(b) == expected for b in got.values())
    finally:
        w.close()
