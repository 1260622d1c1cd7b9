"""`make start` / `make stop` / `make clean` never orphan a daemon (issue 9 item 4): stop waits
until the process is gone, clean stops it first and refuses while it will not go, start
appends to .run/dshd.log. The real Makefile runs in a scratch directory (a copy of Makefile and
pyproject.toml, with their times kept) against this checkout's .venv, so `clean` cannot touch
the checkout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


@pytest.fixture
def scratch():
    d = Path(tempfile.mkdtemp(prefix="dsh-mk-"))
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(REPO / name, d / name)
    pids: list[int] = []
    yield d, pids
    for pid in pids:  # whatever a failed assertion left running
        if _alive(pid):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)


def _make(d: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_SOCKET", "DSH_STATE_DIR")}
    env["DSH_CONNECT_TIMEOUT"] = "2"
    return subprocess.run(["make", "--no-print-directory", f"VENV={VENV}", *args], cwd=d,
                          env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def _pid(d: Path) -> int:
    r = subprocess.run([str(VENV / "bin/dsh"), "status", "--json"], capture_output=True,
                       text=True, env=dict(os.environ, DSH_SOCKET=str(d / ".run/dshd.sock")))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["pid"]


def test_stop_waits_and_start_appends_the_log(scratch):
    d, pids = scratch
    r = _make(d, "start")
    assert r.returncode == 0 and "dshd started" in r.stdout, r.stdout + r.stderr
    first = _pid(d)
    pids.append(first)
    assert "already running" in _make(d, "start").stdout
    r = _make(d, "stop")
    assert r.returncode == 0 and f"stopped dshd (pid {first})" in r.stdout, r.stdout + r.stderr
    assert not _alive(first)  # gone when `make stop` returns, not just signalled
    assert _make(d, "start").returncode == 0
    second = _pid(d)
    pids.append(second)
    assert second != first
    log = (d / ".run/dshd.log").read_text()
    ready = [json.loads(line)["pid"] for line in log.splitlines() if '"dshd.ready"' in line]
    assert ready == [first, second]  # the first run's log is still there
    assert _make(d, "stop").returncode == 0 and not _alive(second)
    assert "dshd is not running" in _make(d, "stop").stdout


def test_clean_stops_the_daemon_first_and_refuses_while_it_will_not_go(scratch):
    d, pids = scratch
    assert _make(d, "start").returncode == 0
    pid = _pid(d)
    pids.append(pid)
    r = _make(d, "clean")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not _alive(pid) and not (d / ".run").exists()

    assert _make(d, "start").returncode == 0
    pid = _pid(d)
    pids.append(pid)
    os.kill(pid, signal.SIGSTOP)  # a daemon that neither answers nor exits
    try:
        r = _make(d, "clean", "STOP_WAIT=2")
        assert r.returncode != 0 and f"pid {pid}) is still running" in r.stdout, r.stdout
        assert _alive(pid) and (d / ".run/state").is_dir()  # nothing deleted under it
    finally:
        os.kill(pid, signal.SIGCONT)  # the pending SIGTERM now stops it gracefully
    r = _make(d, "clean")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not _alive(pid) and not (d / ".run").exists()
