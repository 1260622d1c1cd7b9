"""The dsh CLI against a real dshd: exit codes, timeout, listing, log, not-running error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import wait_until_gone


def test_run_prints_output_and_exits_with_the_commands_code(daemon, workdir):
    r = daemon.dsh("run", "--", "sh", "-c", "echo hello; echo oops >&2; exit 3", cwd=str(workdir))
    assert r.returncode == 3, r.stderr
    assert r.stdout == "hello\noops\n"  # stdout and stderr merge in arrival order
    assert "session " in r.stderr and " call " in r.stderr
    assert daemon.dsh("run", "--", "false", cwd=str(workdir)).returncode == 1
    assert daemon.dsh("run", "--", "true", cwd=str(workdir)).returncode == 0


def test_timeout_kills_the_command(daemon, workdir):
    needle = "sleep 100.417"  # unique: found in /proc whatever pid namespace it runs in
    r = daemon.dsh("run", "--timeout", "1", "--", "sh", "-c", f"echo started; {needle}; echo never",
                   cwd=str(workdir))
    assert r.returncode == 124, (r.stdout, r.stderr)
    assert r.stdout == "started\n"
    assert "TOOL_TIMEOUT" in r.stderr or "timed out" in r.stderr
    assert wait_until_gone(needle) == []


def test_sessions_log_status_and_session_reuse(daemon, workdir):
    r = daemon.dsh("run", "--", "echo", "first", cwd=str(workdir))
    assert r.returncode == 0
    sid = r.stderr.split("session ", 1)[1].split()[0]
    r = daemon.dsh("run", "--session", sid, "--call-id", "second-call", "--", "echo", "second",
                   cwd=str(workdir))
    assert r.returncode == 0 and r.stdout == "second\n"
    sessions = json.loads(daemon.dsh("--json", "sessions").stdout)
    listed = sessions["sessions"] if isinstance(sessions, dict) else sessions
    mine = [s for s in listed if s["sessionId"] == sid]
    assert mine and mine[0]["cwd"] == str(workdir)
    human = daemon.dsh("sessions")
    assert human.returncode == 0 and sid in human.stdout
    log = daemon.dsh("log", sid, "--json")
    events = [json.loads(line) for line in log.stdout.splitlines()]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert [e["data"]["callId"] for e in events if e["type"] == "tool/result"][-1] == "second-call"
    assert "tool/result" in daemon.dsh("log", sid).stdout
    status = json.loads(daemon.dsh("status", "--json").stdout)
    assert status["pid"] == daemon.pid and status["sandbox"]["provider"] == "bwrap"
    wait = json.loads(daemon.dsh("wait", sid, "second-call", "--json").stdout)
    assert wait["content"] == "second\n"


def test_unknown_session_is_a_clear_error(daemon, workdir):
    r = daemon.dsh("run", "--session", "nosuchsession", "--", "true", cwd=str(workdir))
    assert r.returncode != 0 and "not found" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_daemon_not_running_says_how_to_start_it(tmp_path):
    env = dict(os.environ, DSH_SOCKET=str(tmp_path / "nothing.sock"))
    for args in (["status"], ["sessions"], ["run", "--", "true"]):
        r = subprocess.run([sys.executable, "-m", "client.cli", *args], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        assert "not running" in r.stderr and "dshd" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_ctrl_c_detaches_and_attach_picks_up(daemon, workdir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "client.cli", "run", "--", "sh", "-c",
         "for i in $(seq 1 60); do echo tick $i; sleep 0.05; done"],
        env=daemon.env, cwd=str(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    first = proc.stdout.readline()
    assert first == "tick 1\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "dsh attach" in err
    sid = err.split("session ", 1)[1].split()[0]
    r = daemon.dsh("attach", sid, cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    # attach shows the retained window and then the live output, through the end.
    assert "tick 60\n" in r.stdout
    call_id = err.split(" call ", 1)[1].split()[0]
    result = json.loads(daemon.dsh("wait", sid, call_id, "--json").stdout)
    assert result["exitCode"] == 0 and result["content"].count("tick") == 60
