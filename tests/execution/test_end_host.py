"""``hostlink.end_host``: ending a call host and its command without a daemon (HOST.md §7;
what ``DshdProcess.close()`` and ``python -m dshd hosts --cancel`` use). Real hosts."""

from __future__ import annotations

import json
import subprocess

from dshd.execution.hostlink import end_host, host_alive, host_record
from tests.callhost import helpers

SCRIPT = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.1; done"


def test_end_host_terminates_the_command_and_the_host(tmp_path):
    run = helpers.start_host(tmp_path, ["sh", "-c", SCRIPT], on_daemon_loss="keep")
    run.wait_output(b"ready")
    record = host_record(run.dir)
    assert host_alive(record)
    assert end_host(run.dir) is True
    exit_record = json.loads((run.dir / "exit.json").read_text())
    assert exit_record["reason"] == "cancelled" and exit_record["exitCode"] == 7, exit_record
    assert b"got-term" in run.output()  # TERM first: the trap ran
    assert not host_alive(record)
    assert end_host(run.dir) is False  # nothing left to end


def test_end_host_never_signals_a_reused_pid(tmp_path):
    run = helpers.start_host(tmp_path, ["sh", "-c", SCRIPT], on_daemon_loss="keep")
    run.wait_output(b"ready")
    record = host_record(run.dir)
    assert end_host(run.dir) is True
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        (run.dir / "host.json").write_text(json.dumps({**record, "pid": stranger.pid}))
        assert end_host(run.dir) is False
        assert stranger.poll() is None, "an unrelated process was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_end_host_without_host_json_is_a_no_op(tmp_path):
    assert end_host(tmp_path) is False
