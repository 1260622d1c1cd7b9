"""`make stop` leaves running calls in their call hosts and says so; `make clean` refuses while
they run and `make clean CANCEL=1` ends them first (issue 13 item 6). The real Makefile runs
in a scratch directory (a copy of Makefile and pyproject.toml) against this checkout's .venv,
as tests/e2e/test_e2e_make.py does; the call is a real `dsh run` through the real daemon.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _carriers(token: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _alive(int(name)):
            try:
                if token.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
            except OSError:
                continue
    return found


@pytest.fixture
def scratch():
    d = Path(tempfile.mkdtemp(prefix="dsh-mk-"))
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(REPO / name, d / name)
    (d / "work").mkdir()
    token = "dshmk" + secrets.token_hex(6)
    yield d, token
    # Whatever a failed assertion left: the daemon, then the hosts and their commands.
    subprocess.run([sys.executable, "-m", "dshd", "hosts", "--state-dir", str(d / ".run/state"),
                    "--cancel"], capture_output=True, timeout=60)
    lock = d / ".run/state/dshd.lock"
    if lock.exists():
        pid = int((lock.read_text().split() or ["0"])[0])
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    for pid in _carriers(token):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)


def _env(d: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_SOCKET", "DSH_STATE_DIR")}
    env["DSH_CONNECT_TIMEOUT"] = "2"
    return env


def _make(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", f"VENV={VENV}", *args], cwd=d,
                          env=_env(d), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def _hosts(d: Path) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "dshd", "hosts", "--state-dir",
                        str(d / ".run/state"), "--json"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _start_call(d: Path, token: str) -> None:
    """A `dsh run` of a long command; the client is killed once it runs (the call stays)."""
    env = dict(_env(d), DSH_SOCKET=str(d / ".run/dshd.sock"),
               DSH_STATE_DIR=str(d / ".run/state"))
    dsh = subprocess.Popen([str(VENV / "bin/dsh"), "run", "--", "sh", "-c",
                            f"echo started; sleep 300; : {token}"],
                           cwd=d / "work", env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert dsh.stdout.readline() == b"started\n", dsh.stderr.read()
    finally:
        dsh.kill()
        dsh.wait(10)


def test_stop_leaves_calls_running_and_clean_refuses_until_cancel(scratch):
    d, token = scratch
    assert _make(d, "start").returncode == 0
    _start_call(d, token)
    r = _make(d, "stop")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 tool call(s) keep running in their call hosts" in r.stdout, r.stdout
    hosts = _hosts(d)
    assert len(hosts) == 1 and hosts[0]["state"] == "running", hosts
    assert token in (hosts[0]["command"] or ""), hosts
    host_pid = hosts[0]["pid"]

    r = _make(d, "clean")
    assert r.returncode != 0, r.stdout + r.stderr
    assert "make clean CANCEL=1" in r.stdout and "1 tool call(s) still run" in r.stdout, r.stdout
    assert (d / ".run/state").is_dir() and _alive(host_pid) and _carriers(token)

    r = _make(d, "clean", "CANCEL=1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (d / ".run").exists()
    deadline = time.monotonic() + 30
    while (_alive(host_pid) or _carriers(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(host_pid) and _carriers(token) == []


def test_clean_deletes_nothing_when_the_hosts_cannot_be_counted(scratch):
    """`make clean` fails closed: when `python -m dshd hosts` fails (here a venv whose python
    exits 3 — a named fake, since a real failure of the listing cannot be provoked on
    demand), the count is "unknown", never 0, and the state dir, which may hold running calls'
    logs, is left alone with a message that says why."""
    d, _ = scratch
    state = d / ".run/state"
    (state / "sessions").mkdir(parents=True)
    (state / "sessions/keep").write_text("a running call's state")
    broken = d / "broken-venv/bin"
    broken.mkdir(parents=True)
    for name in ("python", "dsh"):
        (broken / name).write_text("#!/bin/sh\nexit 3\n")
        (broken / name).chmod(0o755)
    r = subprocess.run(["make", "--no-print-directory", f"VENV={broken.parent}", "clean"],
                       cwd=d, env=_env(d), capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "could not count the call hosts" in r.stdout and "nothing was deleted" in r.stdout
    assert (state / "sessions/keep").read_text() == "a running call's state"
