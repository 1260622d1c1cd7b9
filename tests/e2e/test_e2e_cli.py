"""The dsh CLI against a real dshd: exit codes, timeout, listing, log, not-running error."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time


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


def _dsh_popen(daemon, *args: str, cwd: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "client.cli", *args], env=daemon.env, cwd=cwd,
                            stdin=subprocess.DEVNULL, **kw)


def _ids(first_stderr_line: str) -> tuple[str, str]:
    words = first_stderr_line.split()  # "session S call C"
    assert words[0] == "session" and words[2] == "call", first_stderr_line
    return words[1], words[3]


def _listed(daemon) -> list[dict]:
    sessions = json.loads(daemon.dsh("--json", "sessions").stdout)
    return sessions["sessions"] if isinstance(sessions, dict) else sessions


def test_run_refuses_unknown_options_and_creates_nothing(daemon, workdir):
    for args in (["--jsn", "--", "echo", "hi"], ["--timout", "5", "--", "true"]):
        r = daemon.dsh("run", *args, cwd=str(workdir))
        assert r.returncode == 2, (args, r.stderr)
        assert "No such option" in r.stderr and r.stdout == ""
    assert _listed(daemon) == []
    r = daemon.dsh("run", "--", "ls", "-a", cwd=str(workdir))
    assert r.returncode == 0 and ".." in r.stdout.split()
    r = daemon.dsh("run", "ls", "-a", cwd=str(workdir))
    assert r.returncode == 0 and ".." in r.stdout.split()


def test_piped_output_is_complete_and_byte_identical(daemon, workdir):
    expected = "".join(f"{i}\n" for i in range(1, 500_001)).encode()
    dsh = f"{shlex.quote(sys.executable)} -m client.cli"
    r = subprocess.run(["sh", "-c", f"{dsh} run -- seq 1 500000 | wc -l"], env=daemon.env,
                       cwd=str(workdir), capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "500000", r.stderr
    r = subprocess.run([sys.executable, "-m", "client.cli", "run", "--", "seq", "1", "500000"],
                       env=daemon.env, cwd=str(workdir), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected  # cmp
    assert b"not shown" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "client.cli", "run", "--", "sh", "-c",
                        "yes | head -c 20000000"],
                       env=daemon.env, cwd=str(workdir), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) == 20_000_000 and r.stdout == b"y\n" * 10_000_000


def test_a_slow_reader_still_gets_every_byte(daemon, workdir):
    proc = _dsh_popen(daemon, "run", "--", "sh", "-c", "seq 1 300000; sleep 0.3; seq 7 9",
                      cwd=str(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(2)  # the command is long done: the window kept only its last lines
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == "".join(f"{i}\n" for i in [*range(1, 300_001), 7, 8, 9]).encode()


def test_attach_follows_a_flood_completely(daemon, workdir):
    # The flood starts once the attached client has shown "ready" (a file the test creates),
    # not after a fixed sleep: on a loaded machine the client may take longer than any sleep
    # to start. A client that attaches mid-flood is the call-host issue's (complete replay).
    script = ("echo ready; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; "
              "i=$((i+1)); done; seq 1 200000; sleep 0.5; echo END")
    runner = _dsh_popen(daemon, "run", "--", "sh", "-c", script, cwd=str(workdir),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    attach = None
    try:
        sid, cid = _ids(runner.stderr.readline().decode())
        assert runner.stdout.readline() == b"ready\n"
        attach = subprocess.Popen([sys.executable, "-m", "client.cli", "attach", sid, "--call", cid],
                                  env=daemon.env, cwd=str(workdir), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        first = attach.stdout.readline()
        (workdir / "go").touch()
        rest, err = attach.communicate(timeout=60)
        assert attach.returncode == 0, err
        assert first + rest == b"ready\n" + "".join(f"{i}\n" for i in range(1, 200_001)).encode() \
            + b"END\n"
    finally:
        if attach is not None and attach.poll() is None:
            attach.kill()
        (workdir / "go").touch()
        runner.communicate(timeout=60)


def test_a_cancelled_command_that_exits_0_makes_run_exit_130(daemon, workdir):
    # No sandbox: under bwrap the TERM ends bwrap itself (exit 143) before sh can trap it.
    script = 'trap "echo got TERM" TERM; echo ready; sleep 30 & wait; echo end'
    proc = _dsh_popen(daemon, "run", "--sandbox", "danger-full-access", "--", "sh", "-c", script,
                      cwd=str(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sid, cid = _ids(proc.stderr.readline().decode())
    assert proc.stdout.readline() == b"ready\n"
    c = daemon.dsh("cancel", sid, cid, cwd=str(workdir))
    assert c.returncode == 0, c.stderr
    out, err = proc.communicate(timeout=60)
    assert b"got TERM\n" in out and out.endswith(b"end\n")
    assert b"TOOL_CANCELLED" in err
    assert proc.returncode == 130
    result = json.loads(daemon.dsh("wait", sid, cid, "--json").stdout)
    assert result["errorCode"] == "TOOL_CANCELLED" and result["exitCode"] == 0


def test_sessions_table_cuts_a_huge_title(daemon, workdir):
    long = "x" * 100_000
    r = daemon.dsh("run", "--", "echo", long, cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    human = daemon.dsh("sessions")
    assert human.returncode == 0
    assert all(len(line) < 300 for line in human.stdout.splitlines())
    assert "…" in human.stdout
    title = _listed(daemon)[0]["title"]  # --json is all the daemon holds: 1,024 chars at most
    assert len(title) == 1024 and title == f"echo {long}"[:1023] + "…"


def test_log_after_below_minus_one_is_a_usage_error(daemon, workdir):
    r = daemon.dsh("log", "whatever", "--after", "-5")
    assert r.returncode == 2 and "--after" in r.stderr
    assert "Traceback" not in r.stderr
