"""``python -m dshd hosts``: what still runs under a state directory, and ending it (issue 13
item 6). Real call hosts (``dshd/callhost/main.py``, started as the runner starts them) in a
state directory's layout, and the real command in a subprocess.

Every host a test starts is ended by the fixture (pid + startTime checked, token carriers).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.callhost import helpers

SID = "s" + "0" * 25


def _hosts(state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dshd", "hosts", "--state-dir", str(state), *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def state(tmp_path):
    calls = tmp_path / "state" / "sessions" / SID / "calls"
    calls.mkdir(parents=True, mode=0o700)
    started: list[helpers.HostRun] = []

    def start(call_id: str, argv: list[str]) -> helpers.HostRun:
        run = helpers.start_host(calls, argv, name=call_id)
        started.append(run)
        return run

    yield tmp_path / "state", start
    for run in started:
        fields = (Path(f"/proc/{run.pid}/stat").read_bytes().rpartition(b")")[2].split()
                  if helpers.proc_state(run.pid) else None)
        if fields and int(fields[19]) == run.ready["startTime"]:
            os.kill(run.pid, signal.SIGKILL)
        for pid in helpers.token_carriers(run.spec["token"]):
            os.kill(pid, signal.SIGKILL)


def _fake_host_json(call_dir: Path, pid: int, start_time: int) -> None:
    call_dir.mkdir(mode=0o700)
    (call_dir / "host.json").write_text(json.dumps({
        "version": 1, "pid": pid, "startTime": start_time, "control": "control.sock",
        "segmentBytes": 1 << 28, "tty": False, "stdin": "null"}))


def test_lists_live_hosts_only_and_never_a_reused_pid(state):
    root, start = state
    run = start("live", ["sleep", "300"])
    ended = start("ended", ["true"])
    ended.wait_record()
    calls = root / "sessions" / SID / "calls"
    # A stale host.json whose pid now belongs to another live process (ours): wrong startTime.
    _fake_host_json(calls / "reused", os.getpid(), 1)
    dead = subprocess.Popen(["true"])
    dead.wait()
    _fake_host_json(calls / "dead", dead.pid, 1)
    (calls / "garbage").mkdir()
    (calls / "garbage" / "host.json").write_text("{not json")

    r = _hosts(root, "--json")
    assert r.returncode == 0, r.stderr
    listed = {h["callId"]: h for h in json.loads(r.stdout)}
    assert set(listed) == {"live", "ended"}, listed
    assert listed["live"]["pid"] == run.pid and listed["live"]["state"] == "running"
    assert listed["live"]["sessionId"] == SID and listed["live"]["ageSeconds"] >= 0
    assert listed["ended"]["state"] == "ended"  # exit.json written, lingering for a release
    assert "2 call hosts alive" in r.stderr

    human = _hosts(root)
    assert human.returncode == 0
    lines = sorted(human.stdout.splitlines())
    assert len(lines) == 2 and lines[1].split("\t")[:3] == [SID, "live", str(run.pid)]


def test_a_missing_state_dir_is_an_error_that_names_it(tmp_path):
    r = _hosts(tmp_path / "nope")
    assert r.returncode == 1 and str(tmp_path / "nope") in r.stderr


def test_cancel_ends_every_host_and_refuses_while_a_daemon_holds_the_state_dir(state):
    root, start = state
    runs = [start(f"c{i}", ["sh", "-c", "trap 'exit 3' TERM; sleep 300 & wait"])
            for i in range(2)]
    lock = os.open(root / "dshd.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running dshd holds
    try:
        r = _hosts(root, "--cancel")
        assert r.returncode == 1 and "dsh cancel SESSION CALL" in r.stderr, r.stderr
        assert all(helpers.proc_state(run.pid) not in (None, "Z") for run in runs)
    finally:
        os.close(lock)
    r = _hosts(root, "--cancel")
    assert r.returncode == 0 and "ended 2 of 2 call hosts" in r.stderr, r.stdout + r.stderr
    for run in runs:
        helpers.wait_gone(run.pid)
        assert helpers.token_carriers(run.spec["token"]) == []  # the command's tree too
    assert json.loads(_hosts(root, "--json").stdout) == []


def test_a_closed_stdout_is_exit_141_without_a_traceback(state):
    root, start = state
    start("live", ["sleep", "300"])
    proc = subprocess.Popen([sys.executable, "-m", "dshd", "hosts", "--state-dir", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # `dshd hosts | head -0`: nobody reads
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141 and "Traceback" not in err, err
