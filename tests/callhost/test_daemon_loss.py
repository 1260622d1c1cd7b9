"""A host whose daemon goes away ends its command (``on_daemon_loss = "terminate"``, the
daemon's setting until calls survive a restart, HOST.md §7): nothing runs on that nobody will
record, and the exit record says why. ``keep`` leaves the command running."""

from __future__ import annotations

import json

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
    spec = helpers.make_spec(directory, ["true"], on_daemon_loss=value)
    ready, _ = helpers.run_main(directory, json.dumps(spec).encode())
    assert ready["ok"] is False and "on_daemon_loss" in ready["error"], ready


def test_a_new_daemon_attaches_after_the_first_connection_closed(tmp_path):
    """``keep`` (HOST.md §7): the host runs on with no daemon; a second ``attach`` (the next
    daemon) gets the current extent, then the ``exit`` event; one after the end gets the
    record at once."""
    run = helpers.start_host(tmp_path, ["sh", "-c", "echo one; read x; echo two; exit 4"],
                             on_daemon_loss="keep", stdin="pipe")
    first = run.connect()
    assert first.request("attach")["ok"] is True
    run.wait_output(b"one\n")
    first.close()
    second = run.connect(secret=json.loads((run.dir / "host.json").read_text())["secret"])
    state = second.request("attach")["state"]
    assert state["state"] == "running" and state["endOffset"] == len(b"one\n"), state
    second.write(b"go\n")
    record = second.next_event("exit")["record"]
    assert record["exitCode"] == 4 and record["totalBytes"] == len(b"one\ntwo\n"), record
    second.close()
    third = run.connect()
    reply = third.request("attach")
    assert reply["state"]["state"] == "exited" and reply["state"]["record"] == record
    assert third.next_event("exit")["record"] == record


def test_host_json_holds_what_a_new_daemon_needs_and_only_its_owner_reads_it(tmp_path):
    run = helpers.start_host(tmp_path, ["sh", "-c", SCRIPT], on_daemon_loss="keep",
                             daemon={"completeness": "full"})
    path = run.dir / "host.json"
    record = json.loads(path.read_text())
    assert path.stat().st_mode & 0o777 == 0o600
    assert record["pid"] == run.pid and record["secret"] == run.spec["secret"]
    assert record["token"] == run.spec["token"] and record["tokenVar"] == "DSH_RUN"
    assert isinstance(record["commandPid"], int) and record["onDaemonLoss"] == "keep"
    assert record["daemon"] == {"completeness": "full"}
    control = run.connect(secret=record["secret"])
    assert control.request("terminate", grace=2.0, reason="cancelled")["ok"] is True
    assert run.wait_record()["reason"] == "cancelled"
