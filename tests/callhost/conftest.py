"""Fixtures for the call host's tests: ``hosts`` starts real hosts and ends the ones left."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.callhost import helpers


@pytest.fixture
def hosts(tmp_path: Path):
    started: list[helpers.HostRun] = []

    def start(argv: list[str], **kwargs) -> helpers.HostRun:
        run = helpers.start_host(tmp_path, argv, name=f"call{len(started)}", **kwargs)
        started.append(run)
        return run

    yield start
    for run in started:  # a host a test left behind (linger): end it, and its tree
        stat = Path(f"/proc/{run.pid}/stat")
        try:
            fields = stat.read_bytes().rpartition(b")")[2].split()
        except OSError:
            continue
        if int(fields[19]) == run.ready["startTime"]:
            os.kill(run.pid, signal.SIGKILL)
        for pid in helpers.token_carriers(run.spec["token"]):
            os.kill(pid, signal.SIGKILL)
