"""systemd integration with real sockets: READY=1 over NOTIFY_SOCKET (Type=notify) and
socket activation (LISTEN_FDS), as the units in systemd/ use them."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from client.api import connect


@pytest.fixture
def short_dir():
    d = Path(tempfile.mkdtemp(prefix="dsh-sd-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(5)


async def test_ready_is_sent_once_the_socket_listens(short_dir):
    notify = short_dir / "notify"
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(notify))
    rx.settimeout(30)
    sock = short_dir / "run" / "dshd.sock"
    env = dict(os.environ, NOTIFY_SOCKET=str(notify), DSH_SOCKET=str(sock),
               DSH_STATE_DIR=str(short_dir / "state"))
    proc = subprocess.Popen([sys.executable, "-m", "dshd", "--log-format", "json"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        msg = rx.recv(4096).decode()
        assert "READY=1" in msg.splitlines()
        # READY means listening: a connection succeeds right now, with no retry.
        async with connect(sock) as c:
            assert (await c.status())["pid"] == proc.pid
        assert _stop(proc) == 0
        assert "STOPPING=1" in rx.recv(4096).decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        rx.close()


async def test_socket_activation_uses_the_passed_socket(short_dir):
    path = short_dir / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    env = dict(os.environ, DSH_STATE_DIR=str(short_dir / "state"),
               DSH_SOCKET=str(short_dir / "unused" / "never.sock"), LISTEN_FDS="1")
    # systemd sets LISTEN_PID to the service's pid: exec from a shell that knows its own.
    fd = listener.fileno()
    # The child puts the socket at fd 3 (SD_LISTEN_FDS_START); close_fds runs after
    # preexec_fn and keeps fd 3 because it is in pass_fds.
    proc = subprocess.Popen(
        ["sh", "-c", f'LISTEN_PID=$$ exec "{sys.executable}" -m dshd --log-format json'],
        env=env, pass_fds=(3,), preexec_fn=lambda: os.dup2(fd, 3),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    listener.close()
    try:
        async with connect(path) as c:
            sid = await c.create_session(str(short_dir))
            cid = await c.run_tool(sid, "echo activated", approved=True)
            assert (await c.wait(sid, cid))["content"] == "activated\n"
        assert not (short_dir / "unused").exists()  # it did not bind a socket of its own
        assert _stop(proc) == 0
        assert path.exists()  # the activated socket belongs to systemd: not unlinked
    finally:
        if proc.poll() is None:
            proc.kill()


def test_units_are_well_formed():
    root = Path(__file__).resolve().parents[2] / "systemd"
    service = (root / "dshd.service").read_text()
    assert "Type=notify" in service and "dshd --system" in service
    assert "ListenStream=/run/dsh/dshd.sock" in (root / "dshd.socket").read_text()
    user = (root / "user" / "dshd.service").read_text()
    assert "Type=notify" in user
    assert "ListenStream=%t/dsh/dshd.sock" in (root / "user" / "dshd.socket").read_text()
    verify = shutil.which("systemd-analyze")
    if verify:
        r = subprocess.run([verify, "verify", "--man=no", str(root / "dshd.socket")],
                           capture_output=True, text=True)
        assert "Unknown key" not in r.stderr and "Unknown section" not in r.stderr, r.stderr
