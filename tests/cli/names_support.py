"""What the session-name and show tests of ``tests/cli`` share: a real dshd per test (the
end-to-end suite's ``running_daemon``) and a work directory; imported by the test modules
(their fixtures), so this directory needs no conftest of its own."""

from __future__ import annotations

import json

import pytest

import sys

from e2e.conftest import DaemonProcess, running_daemon

__all__ = ["daemon", "listed", "run_in", "workdir"]


@pytest.fixture
def daemon():
    with running_daemon(prefix="dsh-names-") as d:
        yield d


@pytest.fixture
def workdir(tmp_path):
    w = tmp_path / "work"
    w.mkdir()
    return w


def _argv(self) -> list[str]:
    return [sys.executable, "-m", "client.cli"]


DaemonProcess.dsh_argv = _argv  # the argv ``dsh`` runs as (completion tests set their env)


def run_in(daemon: DaemonProcess, cwd, *args: str) -> str:
    """``dsh run ARGS`` in ``cwd``; the session id it made or used (asserted exit 0)."""
    r = daemon.dsh("run", *args, cwd=str(cwd))
    assert r.returncode == 0, r.stderr
    listed_ = listed(daemon)
    return max(listed_, key=lambda s: (s.get("updatedAt") or s["createdAt"],
                                      s["sessionId"]))["sessionId"]


def listed(daemon: DaemonProcess) -> list[dict]:
    r = daemon.dsh("sessions", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    return out if isinstance(out, list) else out["sessions"]
