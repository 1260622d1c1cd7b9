"""The control socket of a real host: who may talk, what closes a connection, and that no
connection can stop or block the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.callhost import helpers

PEER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("refused: permission")  # the socket file is 0600 in a 0700 directory
    sys.exit(0)
try:
    s.sendall(('{"hello": 1, "secret": "%s"}\\n' % sys.argv[2]).encode())
    print(repr(s.recv(4096)))
except (BrokenPipeError, ConnectionResetError):
    print("b''")  # closed by the host
"""


def _alive(conn: helpers.Control) -> None:
    assert conn.request("status")["state"] == "running"


def test_a_wrong_secret_is_refused_and_the_host_keeps_working(hosts):
    run = hosts(["/bin/sleep", "30"])
    bad = helpers.Control(run.dir, "", hello=False)
    bad.send_line({"hello": 1, "secret": "0" * 32})
    assert bad.read_line() is None
    no_hello = helpers.Control(run.dir, "", hello=False)
    no_hello.send_line({"id": 1, "op": "status"})
    assert no_hello.read_line() is None
    _alive(run.connect())


def test_another_uid_is_refused_even_with_the_secret(hosts):
    run = hosts(["/bin/sleep", "30"])
    # the system python: the test's own may live where uid 65534 cannot read it
    out = subprocess.run(["/usr/bin/python3", "-I", "-c", PEER, str(run.dir / "control.sock"),
                          run.spec["secret"]], user=65534, group=65534, extra_groups=[],
                         capture_output=True, text=True, timeout=helpers.LIVENESS)
    assert out.stdout.strip() in ("b''", "refused: permission"), (out.stdout, out.stderr)
    same = subprocess.run([sys.executable, "-I", "-c", PEER, str(run.dir / "control.sock"),
                           run.spec["secret"]], capture_output=True, text=True,
                          timeout=helpers.LIVENESS)
    assert '"hello":1' in same.stdout, (same.stdout, same.stderr)


def test_a_malformed_line_closes_only_that_connection(hosts):
    run = hosts(["/bin/sleep", "30"])
    keep = run.connect()
    for garbage in (b"not json\n", b"[1, 2]\n", b'{"op": "status"}\n', b'{"id": true}\n'):
        conn = run.connect()
        conn.send_line(garbage)
        assert conn.closed_by_peer(), garbage
    _alive(keep)
    reply = keep.request("nonsense")
    assert reply["ok"] is False and reply["code"] == "bad-request"
    reply = keep.request("terminate", grace=-1)
    assert reply["code"] == "bad-request"
    _alive(run.connect())


def test_an_overlong_line_closes_the_connection(hosts):
    run = hosts(["/bin/sleep", "30"])
    conn = run.connect()
    try:
        conn.sock.sendall(b"x" * (4 * 1048576 + 65536))
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert conn.closed_by_peer()
    _alive(run.connect())


def test_connections_are_bounded(hosts):
    run = hosts(["/bin/sleep", "30"])
    conns = [run.connect() for _ in range(8)]
    extra = helpers.Control(run.dir, "", hello=False)
    assert extra.closed_by_peer()
    for conn in conns:
        _alive(conn)
    conns[0].close()
    time.sleep(0.2)
    _alive(run.connect())


def test_silent_connections_cannot_lock_the_daemon_out(hosts):
    run = hosts(["/bin/sleep", "30"])
    silent = [helpers.Control(run.dir, "", hello=False) for _ in range(20)]
    _alive(run.connect())  # evicts the oldest silent one
    assert silent[0].closed_by_peer()


def test_a_dead_connection_does_not_block_output(hosts):
    script = "head -c 50000000 /dev/zero | tr '\\0' 'y'; echo end"
    run = hosts(["/bin/sh", "-c", script])
    dead = run.connect()
    dead.request("attach")  # attached, then never read again
    record = run.wait_record(timeout=120)
    assert record["totalBytes"] == 50_000_004 and record["exitCode"] == 0
    assert run.output().endswith(b"yend\n")
    live = run.connect()
    assert live.request("status")["state"] == "exited"


def test_a_peer_that_does_not_read_its_replies_is_dropped(hosts):
    run = hosts(["/bin/sleep", "30"])
    greedy = run.connect()
    line = json.dumps({"id": 1, "op": "status"}).encode() + b"\n"
    greedy.sock.settimeout(5)
    try:
        for _ in range(200):  # ~3 MB of replies, far past socket buffers and the host's bound
            greedy.sock.sendall(line * 500)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    conn = run.connect()
    _alive(conn)
    deadline = time.monotonic() + helpers.LIVENESS
    while sum(os.readlink(f"/proc/{run.pid}/fd/{fd}").startswith("socket:")
              for fd in os.listdir(f"/proc/{run.pid}/fd")) > 2:  # listener + conn
        assert time.monotonic() < deadline, "the host kept a peer that never reads"
        time.sleep(0.05)
    _alive(conn)


def test_attach_pushes_progress_and_exit_events(hosts):
    run = hosts(["/bin/sh", "-c", "read x; echo one; sleep 0.2; echo two"], stdin="pipe")
    conn = run.connect()
    state = conn.request("attach")["state"]
    assert state["state"] == "running" and state["endOffset"] == 0
    conn.write(b"\n")
    first = conn.next_event("progress")
    assert first["endOffset"] >= 4 and first["firstOffset"] == 0
    record = conn.next_event("exit")["record"]
    assert record["totalBytes"] == 8 and record["totalLines"] == 2
    late = run.connect()
    assert late.request("attach")["state"]["state"] == "exited"
    assert late.next_event("exit")["record"] == record


def test_progress_events_are_coalesced(hosts):
    # 1000 writes, ~1 ms apart: one event per write would be ~1000 events; the host sends at
    # most one per PROGRESS_INTERVAL after a burst of PROGRESS_BURST, plus the one before the
    # exit event (the slack covers delivery delays on a loaded machine).
    program = ("import os, time\n"
               "for i in range(1000):\n"
               "    os.write(1, b'%d\\n' % i); time.sleep(0.001)\n")
    started = time.time()
    run = hosts([sys.executable, "-I", "-S", "-c", program], stdin="pipe")
    conn = run.connect()
    conn.request("attach")
    count = 0
    while True:
        msg = conn.read_line()
        assert msg is not None
        if msg.get("event") == "exit":
            break
        count += msg.get("event") == "progress"
    span = msg["record"]["endedAt"] - started  # an upper bound of the host's sending span
    from dshd.callhost import host as host_module
    assert 1 <= count <= span / host_module.PROGRESS_INTERVAL + host_module.PROGRESS_BURST + 1, (
        count, span)
    assert count < 800, count  # fewer events than writes: they were coalesced
