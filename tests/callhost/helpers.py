"""Starting a real call host the way the runner does, and talking to its control socket.

:func:`start_host` runs ``python3 -I -S dshd/callhost/main.py`` with a pipe as stdin and
stdout, ``host.log`` as stderr, ``close_fds`` and a new session, writes the spec, reads the
ready line and reaps the intermediate process. :class:`Control` is a plain blocking
``socket`` client of the JSON-lines protocol (hello, requests, events). Liveness bounds are
generous (the machine is shared); nothing here measures speed.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import dshd.callhost

MAIN = str(Path(dshd.callhost.__file__).resolve().parent / "main.py")
LIVENESS = 30.0


class HostRun:
    def __init__(self, directory: Path, spec: dict, ready: dict, popen: subprocess.Popen) -> None:
        self.dir = directory
        self.spec = spec
        self.ready = ready
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.ready["pid"]

    def connect(self, secret: str | None = None) -> "Control":
        return Control(self.dir, secret or self.spec["secret"])

    def wait_record(self, timeout: float = LIVENESS) -> dict:
        path = self.dir / "exit.json"
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert time.monotonic() < deadline, f"no exit.json within {timeout} s"
            time.sleep(0.02)
        return json.loads(path.read_text())

    def output(self) -> bytes:
        return (self.dir / "output.raw").read_bytes()

    def wait_output(self, needle: bytes, timeout: float = LIVENESS) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            data = self.output()
            if needle in data:
                return data
            assert time.monotonic() < deadline, f"{needle!r} not in the output: {data[-500:]!r}"
            time.sleep(0.02)

    def host_log(self) -> str:
        return (self.dir / "host.log").read_text(errors="replace")


def make_spec(directory: Path, argv: list[str], **overrides) -> dict:
    spec = {
        "version": 1, "dir": str(directory), "argv": argv, "cwd": "/",
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}, "user": None,
        "tty": None, "stdin": "null", "pass_fds": [], "spare_wrapper": None,
        "token_var": "DSH_RUN", "token": secrets.token_hex(16),
        "spill_max_bytes": 1 << 30, "segment_bytes": 1 << 28, "timeout": None,
        "kill_grace": 2.0, "eof_grace": 2.0, "linger": 60.0, "secret": secrets.token_hex(16),
        # Most tests drive the host without a daemon: they must not lose the command when
        # their connection closes (test_daemon_loss.py tests the daemon's default).
        "on_daemon_loss": "keep",
    }
    spec.update(overrides)
    return spec


def start_host(tmp_path: Path, argv: list[str], *, name: str = "call", pass_fds=(),
               **overrides) -> HostRun:
    directory = tmp_path / name
    directory.mkdir(mode=0o700)
    spec = make_spec(directory, argv, pass_fds=list(pass_fds), **overrides)
    ready, popen = run_main(directory, json.dumps(spec).encode(), pass_fds=pass_fds)
    assert ready.get("ok") is True, ready
    return HostRun(directory, spec, ready, popen)


def run_main(directory: Path, spec_bytes: bytes, pass_fds=()) -> tuple[dict, subprocess.Popen]:
    """Start main.py as the runner will; returns the ready line and the (reaped) Popen."""
    with open(directory / "host.log", "ab") as log:
        popen = subprocess.Popen([sys.executable, "-I", "-S", MAIN], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=log, close_fds=True,
                                 pass_fds=tuple(pass_fds), start_new_session=True, cwd="/")
    popen.stdin.write(spec_bytes)
    popen.stdin.close()
    line = popen.stdout.readline()
    popen.wait(timeout=LIVENESS)
    assert line, f"no ready line; host.log: {(directory / 'host.log').read_text()}"
    return json.loads(line), popen


class Control:
    """A blocking control connection (hello done in the constructor)."""

    def __init__(self, directory: Path, secret: str, hello: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dirfd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
        self.sock.settimeout(LIVENESS)
        deadline = time.monotonic() + LIVENESS
        while True:
            try:
                self.sock.connect(f"/proc/self/fd/{dirfd}/control.sock")
                break
            except BlockingIOError:  # the listener's backlog is full: the host accepts soon
                assert time.monotonic() < deadline, "the host accepts no connection"
                time.sleep(0.01)
        os.close(dirfd)
        self._buf = b""
        self._next_id = 1
        self.events: list[dict] = []
        if hello:
            self.send_line({"hello": 1, "secret": secret})
            answer = self.read_line()
            assert answer is not None and answer.get("hello") == 1, answer

    def send_line(self, obj) -> None:
        raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n"
        self.sock.sendall(raw)

    def read_line(self) -> dict | None:
        """The next line, None at end of file."""
        while b"\n" not in self._buf:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def request(self, op: str, **fields) -> dict:
        request_id = self._next_id
        self._next_id += 1
        self.send_line({"id": request_id, "op": op, **fields})
        while True:
            msg = self.read_line()
            assert msg is not None, f"the host closed the connection during {op}"
            if "event" in msg:
                self.events.append(msg)
            elif msg.get("id") == request_id:
                return msg

    def write(self, data: bytes) -> dict:
        return self.request("write", data=base64.b64encode(data).decode())

    def next_event(self, kind: str) -> dict:
        for i, event in enumerate(self.events):
            if event["event"] == kind:
                return self.events.pop(i)
        while True:
            msg = self.read_line()
            assert msg is not None, f"closed before a {kind} event"
            if msg.get("event") == kind:
                return msg
            self.events.append(msg)

    def closed_by_peer(self) -> bool:
        """True when the host closed this connection (end of file within the bound)."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def proc_state(pid: int) -> str | None:
    """The state letter of ``pid``; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return raw.rpartition(b")")[2].split()[0].decode()


def wait_gone(pid: int, timeout: float = LIVENESS) -> None:
    """Wait until ``pid`` is gone or a zombie."""
    deadline = time.monotonic() + timeout
    while proc_state(pid) not in (None, "Z", "X"):
        assert time.monotonic() < deadline, f"process {pid} still runs after {timeout} s"
        time.sleep(0.02)


def token_carriers(token: str) -> list[int]:
    """Live processes whose environment holds DSH_RUN=<token>."""
    needle = f"DSH_RUN={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and proc_state(int(name)) not in (None, "Z", "X"):
            found.append(int(name))
    return found
