"""systemd integration with real sockets: READY=1 over NOTIFY_SOCKET (Type=notify) and
socket activation (LISTEN_FDS), as the units in systemd/ use them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from client.api import connect
from dshd.service import unit_timeout_stop_sec


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
        # STATUS= refreshes may come in between; STOPPING=1 must come before the socket is idle.
        seen = [rx.recv(4096).decode() for _ in range(1)]
        while not any("STOPPING=1" in m.splitlines() for m in seen):
            seen.append(rx.recv(4096).decode())  # rx times out (30 s) if it never comes
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


def _render(template: Path, out: Path) -> Path:
    """The substitution systemd/install.sh makes (@BINDIR@: a bin directory holding dshd;
    @TIMEOUT_STOP_SEC@: ``python -m dshd.service``)."""
    text = template.read_text()
    text = text.replace("@BINDIR@", str(Path(sys.executable).parent))
    text = text.replace("@DOCDIR@", "/usr/share/doc/dsh")
    text = text.replace("@TIMEOUT_STOP_SEC@", str(unit_timeout_stop_sec()))
    assert not re.search(r"@[A-Z_]+@", text), "a placeholder install.sh does not fill in"
    out.write_text(text)
    return out


def _directives(unit: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in unit.read_text().splitlines()
                if "=" in line and not line.startswith("#"))


@pytest.mark.parametrize("scope", ["system", "user"])
def test_units_are_well_formed(scope, short_dir):
    root = Path(__file__).resolve().parents[2] / "systemd"
    src = root if scope == "system" else root / "user"
    service = _render(src / "dshd.service.in", short_dir / "dshd.service")
    socket_unit = short_dir / "dshd.socket"
    shutil.copy(src / "dshd.socket", socket_unit)
    d = _directives(service)
    assert d["Type"] == "notify" and d["Wants"] == "dshd.socket" and "Requires" not in d
    assert d["WatchdogSec"] == "30" and d["ExecReload"] == "/bin/kill -HUP $MAINPID"
    # The one stop budget: stop_timeout_seconds' default (10 s) plus the 5 s margin.
    assert d["TimeoutStopSec"] == "15" == str(unit_timeout_stop_sec())
    # A stop or restart signals dshd alone: running calls' hosts stay (HOST.md §7, on_stop).
    assert d["KillMode"] == "process"
    assert d["ExecStart"].startswith(str(Path(sys.executable).parent / "dshd"))
    assert ("--system" in d["ExecStart"]) == (scope == "system")
    # Tools run in workspaces anywhere (/tmp too) and full-access tools inherit the namespaces.
    for absent in ("PrivateTmp", "ProtectSystem", "ProtectHome", "NoNewPrivileges"):
        assert absent not in d, absent
    listen = _directives(socket_unit)["ListenStream"]
    assert listen == ("/run/dsh/dshd.sock" if scope == "system" else "%t/dsh/dshd.sock")
    verify = shutil.which("systemd-analyze")
    if verify is None:
        pytest.skip("systemd-analyze is not installed")
    env = dict(os.environ)
    cmd = [verify, "verify", "--man=no", str(service), str(socket_unit)]
    if scope == "user":
        (short_dir / "rt").mkdir()
        env["XDG_RUNTIME_DIR"] = str(short_dir / "rt")  # the user manager's runtime dir
        cmd.insert(1, "--user")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    # Clean: an unknown key or section is only a warning on stderr, so nothing may be there.
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
