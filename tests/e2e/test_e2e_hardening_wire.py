"""The wire layer under hostile or careless clients (issue 10, items 12, 13, 16, 17, 18, 24).

Every test talks to a real ``dshd`` over its real Unix socket with raw sockets (no client
library between the test and the bytes), so they keep guarding when the connection layer is
rebuilt: one huge batch line or many partial lines never stall other clients or blow up the
daemon's memory; a response object, a batch with ``subscribe`` or a half-close never loses an
answer (while a peer that closed entirely is not waited for); a refused peer reads its error
line; a long line with no parser thread to be had fails closed; relative paths work.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from .conftest import running_daemon, throwaway_user

STATUS = b'{"jsonrpc":"2.0","id":1,"method":"daemon.status"}'


class RawClient:
    """One raw socket to dshd: send bytes or objects, read lines (stream notifications are
    kept aside in ``notes`` while waiting for a response)."""

    def __init__(self, path: Path, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buf = b""
        self.notes: list[dict] = []

    def send(self, msg: dict | list | bytes) -> None:
        data = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        self.sock.sendall(data if data.endswith(b"\n") else data + b"\n")

    def line(self) -> bytes | None:
        """The next line without its newline; None at EOF."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def msg(self):
        line = self.line()
        assert line is not None, "the daemon closed the connection"
        return json.loads(line)

    def answer(self):
        """The next message that is not a stream notification."""
        while True:
            m = self.msg()
            if isinstance(m, dict) and m.get("method") == "stream":
                self.notes.append(m)
                continue
            return m

    def call(self, rid, method: str, params: dict | None = None) -> dict:
        req = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            req["params"] = params
        self.send(req)
        m = self.answer()
        assert isinstance(m, dict) and m.get("id") == rid, m
        return m

    def init(self) -> "RawClient":
        assert "result" in self.call(0, "initialize", {"protocolVersion": 1})
        return self

    def stream(self) -> dict:
        """The next stream notification (kept ones first)."""
        if self.notes:
            return self.notes.pop(0)
        while True:
            m = self.msg()
            if isinstance(m, dict) and m.get("method") == "stream":
                return m

    def close(self) -> None:
        self.sock.close()


def status_within(path: Path, bound: float) -> float:
    """Connect, initialize, ask daemon.status; the seconds it took (asserted ≤ bound)."""
    t0 = time.monotonic()
    c = RawClient(path, timeout=bound)
    try:
        c.init()
        r = c.call(1, "daemon.status")
        assert "result" in r, r
    finally:
        c.close()
    took = time.monotonic() - t0
    assert took <= bound, f"daemon.status took {took:.2f} s (bound {bound} s)"
    return took


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture
def limited_daemon(request):
    """dshd with a small config (``request.param``: TOML text)."""
    with running_daemon(request.param, prefix="dsh-wire-") as d:
        yield d


def _session_with_running_call(path: Path, workdir: Path, command: str) -> tuple[str, str]:
    c = RawClient(path).init()
    sid = c.call(1, "session.create", {"cwd": str(workdir)})["result"]["sessionId"]
    cid = c.call(2, "tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                 "arguments": {"command": command}})["result"]["callId"]
    c.close()
    return sid, cid


# ---------------------------------------------------------------------- item 12
def _huge_batch(limit: int = 16 * 1024 * 1024) -> bytes:
    n = (limit - 2) // (len(STATUS) + 1)
    return b"[" + b",".join([STATUS] * n) + b"]\n"


def test_a_huge_batch_line_gets_one_error_and_stalls_no_one(daemon):
    line = _huge_batch()
    assert len(line) <= 16 * 1024 * 1024 + 1  # under max_message_bytes: the batch rule applies
    answers: list = []
    errors: list = []

    def flood() -> None:
        try:
            c = RawClient(daemon.socket, timeout=120).init()
            c.send(line)
            first = c.line()
            c.sock.settimeout(0.5)
            try:
                extra = c.line()
            except TimeoutError:
                extra = b"(none)"
            answers.append((first, extra))
            c.close()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=flood) for _ in range(3)]
    for t in threads:
        t.start()
    took = []
    while any(t.is_alive() for t in threads):
        took.append(status_within(daemon.socket, 2.0))
    for t in threads:
        t.join()
    assert not errors, errors
    assert took, "the control client never got to ask"
    firsts, extras = [a[0] for a in answers], [a[1] for a in answers]
    assert len(firsts) == 3
    for first in firsts:
        err = json.loads(first)
        assert isinstance(err, dict), "a refused batch is one error object, not an array"
        assert err["id"] is None and err["error"]["code"] == -32600
        assert "1000" in err["error"]["message"]  # names the bound
    assert extras == [b"(none)"] * 3  # exactly one answer per line
    assert daemon.peak_rss_kib() < 400 * 1024
    # A batch at the bound is served as usual: one array with every answer.
    c = RawClient(daemon.socket).init()
    c.send(b"[" + b",".join([STATUS] * 1000) + b"]")
    arr = c.msg()
    assert isinstance(arr, list) and len(arr) == 1000 and all("result" in a for a in arr)


# ---------------------------------------------------------------------- item 13
@pytest.mark.parametrize("limited_daemon", ["max_connections = 8\n"], indirect=True)
def test_the_connection_past_max_connections_is_refused_the_others_work(limited_daemon):
    d = limited_daemon
    time.sleep(0.2)  # the start probe's connection has gone
    clients = [RawClient(d.socket).init() for _ in range(8)]
    extra = RawClient(d.socket)
    err = json.loads(extra.line())
    assert err["id"] is None and err["error"]["code"] == -32013
    assert "limit exceeded" in err["error"]["message"] and "8" in err["error"]["message"]
    assert extra.line() is None  # closed
    for i, c in enumerate(clients):
        assert "result" in c.call(10 + i, "daemon.status")
    clients.pop().close()
    time.sleep(0.2)
    again = RawClient(d.socket).init()  # a freed slot is usable again
    assert again.call(1, "daemon.status")["result"]["connections"] == 8


def test_partial_lines_are_bounded_across_connections(daemon):
    chunk = b"x" * (1 << 20)
    outcomes: list[str] = []
    lock = threading.Lock()

    def hoard() -> None:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(60)
        try:
            s.connect(str(daemon.socket))
            for _ in range(15):
                s.sendall(chunk)  # 15 MiB, never a newline
            s.settimeout(3)
            got = s.recv(4096)
            outcome = "refused: " + got.decode(errors="replace") if got else "closed"
        except TimeoutError:
            outcome = "held"
        except OSError as exc:  # the daemon closed while we sent: its line may still be there
            try:
                s.settimeout(1)
                got = s.recv(4096)
            except OSError:
                got = b""
            outcome = f"closed ({exc.__class__.__name__}): " + got.decode(errors="replace")
        finally:
            s.close()
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=hoard) for _ in range(40)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        status_within(daemon.socket, 5.0)
        time.sleep(0.1)
    for t in threads:
        t.join()
    assert daemon.running
    refused = [o for o in outcomes if o != "held"]
    assert refused, outcomes
    assert any("-32013" in o and "limit exceeded" in o for o in refused), outcomes
    assert vm_kib(daemon.pid, "VmHWM") < 400 * 1024
    status_within(daemon.socket, 5.0)


# ---------------------------------------------------------------------- item 16
JUNK_ENVELOPES = [
    {"jsonrpc": "2.0", "id": 7, "result": {}},  # a response
    {"jsonrpc": "2.0", "id": 8, "error": {"code": -32000, "message": "x"}},  # an error answer
    {"jsonrpc": "2.0", "id": None, "result": None},
    {"jsonrpc": "2.0", "id": 9, "method": "daemon.status", "result": {}},  # both
    {"jsonrpc": "2.0", "id": 10, "method": "daemon.status", "error": {"code": 1, "message": ""}},
    {"jsonrpc": "2.0", "id": 1.5, "method": "daemon.status"},
    {"jsonrpc": "2.0", "id": [1], "method": "daemon.status"},
    {"jsonrpc": "2.0", "id": {"a": 1}, "method": "daemon.status"},
    {"jsonrpc": "2.0", "id": True, "method": "daemon.status"},
    {"jsonrpc": "2.0", "id": 11, "method": 5},
    {"jsonrpc": "2.0", "id": 12, "method": "daemon.status", "params": 3},
    {"jsonrpc": "1.0", "id": 13, "method": "daemon.status"},
    {"id": 14, "method": "daemon.status"},
    {"jsonrpc": "2.0"},
]


def test_response_objects_and_bad_envelopes_are_refused_and_the_connection_lives(daemon, workdir):
    c = RawClient(daemon.socket).init()
    sid = c.call(1, "session.create", {"cwd": str(workdir)})["result"]["sessionId"]
    assert "subscriptionId" in c.call(2, "subscribe", {"sessionId": sid})["result"]
    assert c.stream()["params"]["seq"] == 0
    for junk in JUNK_ENVELOPES:
        c.send(junk)
        err = c.answer()
        assert isinstance(err, dict) and err["error"]["code"] == -32600, (junk, err)
        if "result" in junk or "error" in junk:
            assert err["id"] is None  # never an answer to one of the client's own requests
    c.send(JUNK_ENVELOPES)  # the same as one batch: one array, one error per element
    arr = c.answer()
    assert isinstance(arr, list) and len(arr) == len(JUNK_ENVELOPES)
    assert all(a["error"]["code"] == -32600 for a in arr)
    # The connection and its subscription are intact.
    assert "result" in c.call(3, "daemon.status")
    cid = c.call(4, "tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                 "arguments": {"command": "echo still-streaming"}})["result"]["callId"]
    seen = json.dumps([])
    deadline = time.monotonic() + 30
    while "still-streaming" not in seen or cid not in seen:
        assert time.monotonic() < deadline, "no stream notifications after the junk"
        seen += json.dumps(c.stream())
    assert c.call(5, "tool.wait", {"sessionId": sid, "callId": cid})["result"]["exitCode"] == 0


# ---------------------------------------------------------------------- item 17
def test_a_subscribe_inside_a_batch_is_answered_inside_the_array(daemon, workdir):
    c = RawClient(daemon.socket).init()
    sid = c.call(1, "session.create", {"cwd": str(workdir)})["result"]["sessionId"]
    c.send([
        {"jsonrpc": "2.0", "id": 2, "method": "daemon.status"},
        {"jsonrpc": "2.0", "id": 3, "method": "subscribe", "params": {"sessionId": sid}},
        {"jsonrpc": "2.0", "id": 4, "method": "session.get", "params": {"sessionId": sid}},
    ])
    first = c.msg()
    assert isinstance(first, list), f"the batch's answers must come first, as one array: {first}"
    by_id = {a["id"]: a for a in first}
    assert sorted(by_id) == [2, 3, 4]
    sub_id = by_id[3]["result"]["subscriptionId"]
    base = c.msg()  # the subscription's base batch follows the array
    assert base["method"] == "stream" and base["params"]["subscriptionId"] == sub_id
    assert base["params"]["seq"] == 0


# ---------------------------------------------------------------------- item 18
def test_a_half_closed_client_gets_every_answer(daemon, workdir):
    sid, quick = _session_with_running_call(daemon.socket, workdir, "sleep 1; echo done")
    sid2, slow = _session_with_running_call(daemon.socket, workdir, "sleep 30")
    c = RawClient(daemon.socket, timeout=30)
    for rid, method, params in [
        (0, "initialize", {"protocolVersion": 1}),
        (1, "tool.wait", {"sessionId": sid, "callId": quick}),
        (2, "tool.wait", {"sessionId": sid2, "callId": slow, "timeout": 1.5}),
        (3, "daemon.status", None),
    ]:
        req = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            req["params"] = params
        c.send(req)
    c.sock.shutdown(socket.SHUT_WR)
    got = {}
    while (line := c.line()) is not None:
        m = json.loads(line)
        got[m["id"]] = m
    assert sorted(got) == [0, 1, 2, 3], got
    assert got[1]["result"]["exitCode"] == 0 and got[1]["result"]["content"] == "done\n"
    assert got[2]["error"]["code"] == -32010  # answered at its timeout, then closed
    assert "result" in got[3]


def test_a_client_that_closed_entirely_is_not_waited_for(daemon, workdir):
    sid, slow = _session_with_running_call(daemon.socket, workdir, "sleep 60")
    control = RawClient(daemon.socket).init()
    gone = RawClient(daemon.socket).init()
    gone.send({"jsonrpc": "2.0", "id": 1, "method": "tool.wait",
               "params": {"sessionId": sid, "callId": slow}})
    time.sleep(0.3)
    assert control.call(1, "daemon.status")["result"]["connections"] == 2
    gone.close()  # both halves: nobody will read the answer
    deadline = time.monotonic() + 5
    while control.call(2, "daemon.status")["result"]["connections"] != 1:
        assert time.monotonic() < deadline, "the closed client's connection lingers"
        time.sleep(0.1)


@pytest.fixture
def unprivileged_user():
    with throwaway_user("dshpeer", keep=True, tools=("useradd", "setpriv")) as entry:
        yield entry


REFUSED_PEER = r'''
import json, socket, sys, time
path, delay = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(path)
req = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
try:
    time.sleep(delay)
    s.sendall(req * 200)  # ~16 KiB the daemon never answers
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    rest = s.recv(4096)
    print(json.dumps({"line": data.decode(), "eof": rest == b""}))
except OSError as exc:
    print(json.dumps({"oserror": exc.__class__.__name__}))
'''


def test_a_refused_peer_reads_its_error_line(daemon, unprivileged_user):
    # Let the other user reach the socket at all, so that the daemon's SO_PEERCRED check is
    # what refuses it.
    os.chmod(daemon.socket.parent, 0o711)
    os.chmod(daemon.socket, 0o666)
    os.chmod(daemon.root, 0o711)
    u = unprivileged_user
    outcomes = []
    for delay in [0, 0.3] * 5:  # at once, and after the daemon has sent its refusal
        r = subprocess.run(
            ["setpriv", f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}", "--clear-groups",
             sys.executable, "-c", REFUSED_PEER, str(daemon.socket), str(delay)],
            capture_output=True, text=True, timeout=60,
        )
        assert r.returncode == 0, r.stderr
        outcomes.append(json.loads(r.stdout))
    for o in outcomes:
        assert "line" in o, outcomes
        assert json.loads(o["line"])["error"]["code"] == -32001
        assert o["eof"]
    status_within(daemon.socket, 5.0)


# ---------------------------------------------------------------------- item 24
def _start_in(cwd: Path, args: list[str], socket_path: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_SOCKET", "DSH_STATE_DIR")}
    with open(cwd / "dshd.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dshd", "--log-format", "json", *args],
                                cwd=cwd, env=env, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, (cwd / "dshd.log").read_text()[-3000:]
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(socket_path))
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("dshd did not listen:\n" + (cwd / "dshd.log").read_text()[-3000:])


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("how", ["flags", "config"])
def test_relative_paths_are_resolved_at_start(tmp_path, how):
    root = Path(tempfile.mkdtemp(prefix="dsh-rel-"))  # short: sun_path is 107 bytes
    try:
        (root / "etc").mkdir()
        if how == "flags":
            args = ["--state-dir", "st", "--socket", "run/s"]
            state, sock = root / "st", root / "run" / "s"
        else:  # a relative --config; relative paths in it are relative to the file
            (root / "etc" / "d.toml").write_text('state_dir = "st"\nsocket = "../run/s"\n')
            args = ["--config", "etc/d.toml"]
            state, sock = root / "etc" / "st", root / "run" / "s"
        proc = _start_in(root, args, sock)
        try:
            c = RawClient(sock).init()
            status = c.call(1, "daemon.status")["result"]
            assert status["stateDir"] == str(state)
            work = tmp_path / "w"
            work.mkdir()
            sid = c.call(2, "session.create", {"cwd": str(work)})["result"]["sessionId"]
            cid = c.call(3, "tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                         "arguments": {"command": "echo ok"}})["result"]["callId"]
            r = c.call(4, "tool.wait", {"sessionId": sid, "callId": cid})["result"]
            assert r["content"] == "ok\n"
            assert (state / "sessions").exists() or any(state.iterdir())
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(root, ignore_errors=True)


PIDS_CGROUP = Path("/sys/fs/cgroup/pids")


def _threads(pid: int) -> list[str]:
    return [(t / "comm").read_text().strip() for t in Path(f"/proc/{pid}/task").iterdir()]


def test_a_long_line_without_a_parser_thread_fails_closed(daemon):
    """Long lines parse on a worker thread; when none can start (a pids limit), the line gets
    a -32603 naming the reason and the daemon goes on (it neither crashes nor stalls)."""
    if os.getuid() != 0 or not (PIDS_CGROUP / "cgroup.procs").exists():
        pytest.skip("needs root and a cgroup v1 pids hierarchy to limit dshd's threads")
    deadline = time.monotonic() + 30  # trio's idle worker threads leave after 10 s
    while len(_threads(daemon.pid)) > 1:
        assert time.monotonic() < deadline, _threads(daemon.pid)
        time.sleep(0.2)
    cg = PIDS_CGROUP / f"dsh-wire-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "cgroup.procs").write_text(str(daemon.pid))
        (cg / "pids.max").write_text("1")  # its one thread: no new one can start
        c = RawClient(daemon.socket).init()
        long_request = {"jsonrpc": "2.0", "id": 1, "method": "daemon.status",
                        "params": {"pad": "x" * 100_000}}
        c.send(long_request)
        err = c.msg()
        assert err["id"] is None and err["error"]["code"] == -32603, err
        assert "thread" in err["error"]["message"] and "not run" in err["error"]["message"]
        assert "result" in c.call(2, "daemon.status")  # short lines need no thread
        (cg / "pids.max").write_text("max")
        c.send(long_request)
        assert "result" in c.answer()
    finally:
        (cg / "pids.max").write_text("max")
        (PIDS_CGROUP / "cgroup.procs").write_text(str(daemon.pid))
        cg.rmdir()
    assert daemon.running
