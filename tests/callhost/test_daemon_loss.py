"""A host whose daemon goes away ends its command (``on_daemon_loss = "terminate"``, the
daemon's setting until calls survive a restart, HOST.md §7): nothing runs on that nobody will
record, and the exit record says why. ``keep`` leaves the command running."""

from __future__ import annotations

import pytest

from tests.callhost import helpers

SCRIPT = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.1; done"


def test_a_closed_daemon_connection_stops_the_command_with_a_message(tmp_path):
    run = helpers.start_host(tmp_path, ["sh", "-c", SCRIPT], on_daemon_loss="terminate")
    daemon = run.connect()
    assert daemon.request("attach")["ok"] is True
    run.wait_output(b"ready")
    daemon.close()  # the daemon died: its end of the socket closes
    record = run.wait_record()
    assert record["reason"] == "killed", record
    assert "dshd went away" in record["message"], record
    assert record["exitCode"] == 7, record  # TERM first: the trap ran
    assert b"got-term" in run.output()


def test_a_host_nobody_attaches_to_stops_the_command(tmp_path):
    # The daemon died between the host's start and its attach (the bound is 30 s; the spec's
    # attach_seconds shortens it here).
    run = helpers.start_host(tmp_path, ["sh", "-c", SCRIPT], on_daemon_loss="terminate",
                             attach_seconds=2.0)
    record = run.wait_record(timeout=60)
    assert record["reason"] == "killed" and "no daemon attached" in record["message"], record


def test_keep_leaves_the_command_running_after_the_connection_closed(tmp_path):
    run = helpers.start_host(tmp_path, ["sh", "-c", SCRIPT], on_daemon_loss="keep")
    first = run.connect()
    assert first.request("attach")["ok"] is True
    run.wait_output(b"ready")
    first.close()
    second = run.connect()
    assert second.request("status")["state"] == "running"
    assert second.request("terminate", grace=2.0, reason="cancelled")["ok"] is True
    assert run.wait_record()["reason"] == "cancelled"


@pytest.mark.parametrize("value", ["detach", 1, None])
def test_on_daemon_loss_must_be_terminate_or_keep(tmp_path, value):
    directory = tmp_path / "call"
    directory.mkdir(mode=0o700)
    import json
    spec = helpers.make_spec(directory, ["true"], on_daemon_loss=value)
    ready, _ = helpers.run_main(directory, json.dumps(spec).encode())
    assert ready["ok"] is False and "on_daemon_loss" in ready["error"], ready
