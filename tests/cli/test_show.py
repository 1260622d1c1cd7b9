"""The show commands through the real ``dsh`` against a real dshd (issue 15 item 6): ``dsh
sessions`` as an aligned table with status and last exit, ``dsh log -f``, ``dsh log`` of a
damaged log, ``dsh status`` in words, ``dsh wait --timeout`` exiting 124."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from client.exits import EXIT_INTERRUPTED, EXIT_TIMEOUT

from durability.helpers import frames, log_path
from tests.e2e.conftest import until
from .names_support import daemon, listed, run_in, workdir  # noqa: F401 - fixtures


def _popen(d, *args: str, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "client.cli", *args], env=d.env,
                            cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)


def test_sessions_is_an_aligned_table_with_status_and_last_exit(daemon, workdir):
    ok = run_in(daemon, workdir, "--", "true")
    failed = daemon.dsh("run", "--", "sh", "-c", "exit 3", cwd=str(workdir))
    assert failed.returncode == 3
    assert daemon.dsh("rename", ok, "good").returncode == 0
    by_id = {s["sessionId"]: s for s in listed(daemon)}
    bad = next(i for i in by_id if i != ok)
    assert by_id[ok]["lastExit"] == 0 and by_id[bad]["lastExit"] == 3
    assert by_id[ok]["pendingApprovals"] == 0 and by_id[ok]["name"] == "good"
    assert by_id[ok]["updatedAt"] >= by_id[ok]["createdAt"]
    long = _popen(daemon, "run", "--session", bad, "--call-id", "slow", "--", "sleep", "60",
                  cwd=workdir)
    try:
        until(lambda: any(s["running"] for s in listed(daemon)), "the call runs")
        table = daemon.dsh("sessions")
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == ["NAME", "ID", "STATUS", "CWD", "UPDATED", "EXIT", "TITLE"]
        assert "\t" not in table.stdout
        columns = [lines[0].index(h) for h in ("ID", "STATUS", "CWD", "UPDATED", "EXIT")]
        rows = {line.split()[1] if not line.startswith("good") else ok: line
                for line in lines[1:]}
        for line in rows.values():  # every cell starts under its header
            for at in columns:
                assert line[at - 2:at] == "  " and line[at] != " ", (line, at)
        assert rows[ok].startswith("good ") and " idle " in rows[ok]
        assert rows[bad].startswith("- ") and " running 1 " in rows[bad]
        assert rows[ok][columns[4]:].split()[0] == "0"
        assert rows[bad][columns[4]:].split()[0] == "3"
    finally:
        daemon.dsh("cancel", bad, "slow")
        long.communicate(timeout=60)


def test_log_follow_prints_new_events_until_ctrl_c(daemon, workdir):
    sid = run_in(daemon, workdir, "--", "echo", "before")
    follower = _popen(daemon, "log", "-f", sid, "--json", cwd=workdir)
    try:
        assert daemon.dsh("run", "--session", sid, "--call-id", "later", "--", "echo", "later",
                          cwd=str(workdir)).returncode == 0
        seen: list[dict] = []
        os.set_blocking(follower.stdout.fileno(), True)

        def later_result():
            seen.append(json.loads(follower.stdout.readline()))
            return seen[-1]["type"] == "tool/result" and seen[-1]["data"]["callId"] == "later"

        until(later_result, "the new call's result is printed")
        seqs = [e["seq"] for e in seen]
        assert seqs == list(range(len(seqs)))  # every event once, in order
        assert follower.poll() is None  # still following
    finally:
        follower.send_signal(signal.SIGINT)
        try:
            _, err = follower.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            follower.kill()
            _, err = follower.communicate()
            raise AssertionError(f"dsh log -f did not end on Ctrl-C: {err!r}") from None
    assert follower.returncode == EXIT_INTERRUPTED, err


def test_log_of_a_damaged_log_prints_the_intact_events_then_the_damage(daemon, workdir):
    sid = run_in(daemon, workdir, "--", "echo", "one")
    for n in range(2):
        assert daemon.dsh("run", "--session", sid, "--", "echo", f"more {n}",
                          cwd=str(workdir)).returncode == 0
    whole = daemon.dsh("log", sid, "--json").stdout.splitlines()
    daemon.stop()
    path = log_path(daemon.state_dir, sid)
    spans = frames(path)  # the header, the first run's events, then later frames
    assert len(spans) > 3
    start, end = spans[2]
    data = bytearray(path.read_bytes())
    data[(start + end) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    daemon.start()
    r = daemon.dsh("log", sid, "--json")
    assert r.returncode == 1, r.stderr
    printed = r.stdout.splitlines()
    assert printed and printed == whole[: len(printed)] and len(printed) < len(whole)
    assert f"damaged at byte {start}" in r.stderr and "intact" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_status_says_the_sandbox_in_words(daemon):
    r = daemon.dsh("status")
    assert r.returncode == 0, r.stderr
    assert "sandbox: bwrap, full confinement" in r.stdout
    assert '{"provider"' not in r.stdout and "completeness" not in r.stdout
    as_json = json.loads(daemon.dsh("status", "--json").stdout)
    assert as_json["sandbox"]["provider"] == "bwrap"


def test_wait_timeout_exits_124_and_says_the_call_still_runs(daemon, workdir):
    sid = run_in(daemon, workdir, "--", "true")
    long = _popen(daemon, "run", "--session", sid, "--call-id", "slow", "--", "sleep", "60",
                  cwd=workdir)
    try:
        until(lambda: any(s["running"] for s in listed(daemon)), "the call runs")
        r = daemon.dsh("wait", sid, "slow", "--timeout", "0.5")
        assert r.returncode == EXIT_TIMEOUT, r.stderr
        assert "still running" in r.stderr and "keeps running" in r.stderr
        assert any(s["running"] for s in listed(daemon))  # the call was not touched
    finally:
        daemon.dsh("cancel", sid, "slow")
        long.communicate(timeout=60)


def test_sessions_on_a_terminal_is_a_table_with_the_name_and_status(daemon, workdir, tmp_path):
    from e2e.tmux import Pane, have_tmux

    if not have_tmux():
        raise AssertionError("tmux is needed for the terminal case (it is installed here)")
    sid = run_in(daemon, workdir, "--", "true")
    assert daemon.dsh("rename", sid, "build").returncode == 0
    pane = Pane(tmp_path, str(daemon.socket), workdir)
    try:
        mark = pane.run("dsh sessions")
        assert pane.done(mark) == 0
        header = pane.until(r"^ *NAME +ID +STATUS +CWD +UPDATED +EXIT +TITLE")
        row = pane.until(rf"^ *build +{sid} +idle +\S+")
        assert row.start() > header.start()
        screen = pane.screen()
        assert "\t" not in screen
        lines = screen.splitlines()
        head = next(line for line in lines if line.lstrip().startswith("NAME"))
        body = next(line for line in lines if line.lstrip().startswith("build"))
        assert body.index(sid) == head.index("ID")  # columns line up on the terminal too
    finally:
        pane.close()
