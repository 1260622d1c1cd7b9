"""``dsh rm`` / ``dsh prune`` / retention through the real CLI against a real dshd (issue 15
item 2): deleting refuses a busy session unless forced, is audited and crash-safe, never
reuses an id; prune deletes only what is old and idle; retention removes settled calls'
output past max_state_bytes and reading it says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import DaemonProcess, running_daemon, until, wait_until_gone

LIVENESS = 30.0  # a generous bound on "it happens", never a speed target


def session_of(r: subprocess.CompletedProcess) -> str:
    assert "session " in r.stderr, r.stderr
    return r.stderr.split("session ", 1)[1].split()[0]


def listed(d) -> list[str]:
    out = json.loads(d.dsh("--json", "sessions").stdout)
    rows = out["sessions"] if isinstance(out, dict) else out
    return [s["sessionId"] for s in rows]


def log_lines(d, event: str) -> list[dict]:
    found = []
    for line in d.log_path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == event:
            found.append(rec)
    return found


def background_run(d, workdir, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "client.cli", "run", *args],
                            env=d.env, cwd=str(workdir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def busy_sessions(d) -> list[str]:
    out = json.loads(d.dsh("--json", "sessions").stdout)
    rows = out["sessions"] if isinstance(out, dict) else out
    return [s["sessionId"] for s in rows if s.get("running")]


def running_session(d) -> str:
    return until(lambda: (busy_sessions(d) or [None])[0], "a session with a running call")


def test_rm_deletes_an_idle_session_audited_and_others_keep_working(daemon, workdir):
    keep = session_of(daemon.dsh("run", "--", "echo", "kept", cwd=str(workdir)))
    gone = session_of(daemon.dsh("run", "--", "sh", "-c", "head -c 50000 /dev/zero | tr '\\0' x",
                                 cwd=str(workdir)))
    r = daemon.dsh("rm", gone)
    assert r.returncode == 0, r.stderr
    assert f"deleted session {gone}" in r.stderr
    assert gone not in listed(daemon) and keep in listed(daemon)
    sessions = daemon.state_dir / "sessions"
    assert not (sessions / gone).exists()
    assert not [p for p in sessions.iterdir() if p.name.startswith(".deleting-")]
    audit = [rec for rec in log_lines(daemon, "session.deleted") if rec["session"] == gone]
    assert len(audit) == 1, daemon.log_tail()
    assert audit[0]["by"] == os.getuid() and audit[0]["forced"] is False
    assert audit[0]["freed_bytes"] >= 50_000
    assert gone in (daemon.state_dir / "deleted.ids").read_text().split()
    # The deleted one is gone for every command; the other still works.
    r = daemon.dsh("log", gone)
    assert r.returncode != 0 and "not found" in r.stderr
    again = daemon.dsh("rm", gone)
    assert again.returncode == 1 and "not found" in again.stderr
    r = daemon.dsh("run", "--session", keep, "--", "echo", "still", cwd=str(workdir))
    assert r.returncode == 0 and r.stdout == "still\n"


def test_rm_refuses_a_busy_session_and_force_cancels_it(daemon, workdir):
    needle = "sleep 100.731"
    # Another client's call in another session runs through the delete untouched.
    other = background_run(daemon, workdir, "--", "sh", "-c",
                           "echo other-up; while [ ! -e go ]; do sleep 0.05; done; echo other-done")
    other_sid = running_session(daemon)
    runner = background_run(daemon, workdir, "--", "sh", "-c", f"echo up; {needle}")
    try:
        sid = until(lambda: next((s for s in busy_sessions(daemon) if s != other_sid), None),
                    "the second running session")
        r = daemon.dsh("rm", sid)
        assert r.returncode == 1, r.stderr
        assert "busy" in r.stderr and f"dsh rm --force {sid}" in r.stderr
        assert "force: true" not in r.stderr  # the CLI's words, not the protocol's
        assert sid in listed(daemon) and (daemon.state_dir / "sessions" / sid).is_dir()
        assert runner.poll() is None  # the refused delete touched nothing
        r = daemon.dsh("--json", "rm", "--force", sid)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"sessionId": sid, "deleted": True, "cancelled": 1}
        assert wait_until_gone(needle) == []
        _, err = runner.communicate(timeout=LIVENESS)
        assert runner.returncode != 0 and err.strip(), err  # its client was told, not hung
        assert "TOOL_CANCELLED: cancelled" in err and "shutting down" not in err, err
        (workdir / "go").touch()
        out, err = other.communicate(timeout=LIVENESS)
        assert other.returncode == 0 and out == "other-up\nother-done\n", err
    finally:
        for proc in (runner, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert sid not in listed(daemon) and other_sid in listed(daemon)
    audit = [rec for rec in log_lines(daemon, "session.deleted") if rec["session"] == sid]
    assert audit and audit[0]["forced"] is True and audit[0]["cancelled"] == 1


def test_rm_of_several_goes_on_past_one_that_fails(daemon, workdir):
    a = session_of(daemon.dsh("run", "--", "true", cwd=str(workdir)))
    b = session_of(daemon.dsh("run", "--", "true", cwd=str(workdir)))
    r = daemon.dsh("rm", a, "nosuchsession", b)
    assert r.returncode == 1 and "not found" in r.stderr
    assert a not in listed(daemon) and b not in listed(daemon)


def test_a_crash_mid_delete_is_finished_at_start_and_never_lists(tmp_path, monkeypatch):
    work = tmp_path / "crash-mid-delete-work"
    work.mkdir()
    monkeypatch.setenv("DSH_TEST_FAULT", "delete-kill:crash-mid-delete-work")
    (tmp_path / "d").mkdir()
    d = DaemonProcess(tmp_path / "d")
    d.start()
    try:
        sid = session_of(d.dsh("run", "--", "echo", "x", cwd=str(work)))
        r = d.dsh("rm", sid)
        assert r.returncode != 0  # the daemon died under it
        until(lambda: not d.running, "the daemon killed by the fault hook")
        d.proc = None
        sessions = d.state_dir / "sessions"
        assert (sessions / f".deleting-{sid}").is_dir() and not (sessions / sid).exists()
        monkeypatch.delenv("DSH_TEST_FAULT")
        d.start()
        assert sid not in listed(d)
        assert not (sessions / f".deleting-{sid}").exists()
        assert log_lines(d, "session.delete_finished")
        assert sid in (d.state_dir / "deleted.ids").read_text().split()
    finally:
        d.close()


def test_a_deleted_id_is_never_minted_again(tmp_path, monkeypatch, workdir):
    (tmp_path / "d").mkdir()
    d = DaemonProcess(tmp_path / "d")
    d.start()
    try:
        sid = session_of(d.dsh("run", "--", "true", cwd=str(workdir)))
        assert d.dsh("rm", sid).returncode == 0
        d.stop()
        # Force the collision: the first id the daemon tries is the deleted one.
        monkeypatch.setenv("DSH_TEST_FAULT", f"mint-id:{sid}")
        d.start()
        new = session_of(d.dsh("run", "--", "echo", "new", cwd=str(workdir)))
        assert new != sid and len(new) == 12
        assert d.dsh("log", sid).returncode != 0
        # And with a live (not deleted) session's id as the first try, too.
        newer = session_of(d.dsh("run", "--", "echo", "newer", cwd=str(workdir)))
        assert newer not in (sid, new)
    finally:
        d.close()


def test_prune_older_than_dry_run_json_and_busy_skipped(daemon, workdir):
    old = session_of(daemon.dsh("run", "--", "true", cwd=str(workdir)))
    bad = daemon.dsh("prune", "--older-than", "7x")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    assert daemon.dsh("prune").returncode == 2  # --older-than is required
    r = daemon.dsh("prune", "--older-than", "7d")
    assert r.returncode == 0 and old in listed(daemon)
    needle = "sleep 100.517"
    runner = background_run(daemon, workdir, "--", "sh", "-c", needle)
    try:
        busy = running_session(daemon)
        time.sleep(1.1)
        dry = json.loads(daemon.dsh("prune", "--older-than", "1s", "--dry-run", "--json").stdout)
        assert dry["dryRun"] is True and old in dry["deleted"] and busy not in dry["deleted"]
        assert {"sessionId": busy, "reason": "busy"} in dry["skipped"]
        assert dry["freedBytes"] > 0
        assert old in listed(daemon)  # a dry run deletes nothing
        r = daemon.dsh("prune", "--older-than", "1s")
        assert r.returncode == 0, r.stderr
        assert f"deleted {old}" in r.stdout and f"skipped {busy}: busy" in r.stdout
        assert old not in listed(daemon) and busy in listed(daemon)
        assert runner.poll() is None
    finally:
        daemon.dsh("cancel", busy if "busy" in dir() else "x", "x")
        runner.kill()
        runner.wait(10)
    audit = [rec for rec in log_lines(daemon, "session.deleted") if rec["session"] == old]
    assert audit and audit[0]["why"] == "session.prune"


def test_retention_deletes_idle_sessions_past_retain_sessions_days(workdir):
    # 0.00002 days = 1.7 s: a session idle past it is deleted by the pass at start.
    with running_daemon("retain_sessions_days = 0.00002\nmax_state_bytes = 0\n") as d:
        sid = session_of(d.dsh("run", "--", "true", cwd=str(workdir)))
        d.stop()
        time.sleep(2.0)
        d.start()
        until(lambda: sid not in listed(d), "the old session deleted by retention")
        audit = [rec for rec in log_lines(d, "session.deleted") if rec["session"] == sid]
        assert audit and audit[0]["why"] == "retain_sessions_days" and audit[0]["by"] is None


def test_retention_removes_old_output_past_max_state_bytes(workdir):
    config = "max_state_bytes = 1\nretention_interval_seconds = 1\n"
    with running_daemon("max_state_bytes = 0\n") as d:
        big = "head -c 300000 /dev/zero | tr '\\0' y; echo; echo tail-line"
        r = d.dsh("run", "--call-id", "big-call", "--", "sh", "-c", big, cwd=str(workdir))
        assert r.returncode == 0
        sid = session_of(r)
        before = json.loads(d.dsh("wait", sid, "big-call", "--json").stdout)
        logged = [json.loads(x) for x in d.dsh("log", sid, "--json").stdout.splitlines()]
        call_dir = d.state_dir / "sessions" / sid / "calls" / "big-call"
        assert (call_dir / "output.raw").exists()
        # The daemon comes back with a tiny bound: the settled call's output goes.
        d.stop()
        cfg = Path(d.extra_args[1])
        cfg.write_text(config)
        d.start()
        # The marker comes first (a crash in between is finished by the next pass), then
        # the bytes go: wait for both.
        until(lambda: (call_dir / "output.removed").exists()
              and not list(call_dir.glob("output.raw*")), "the output removed")
        assert log_lines(d, "retention.output_removed")
        # dsh wait falls back to the logged window and says why; its status is the call's.
        r = d.dsh("wait", sid, "big-call")
        assert r.returncode == 0 and "tail-line" in r.stdout, (r.stdout, r.stderr)
        assert "was removed by max_state_bytes" in r.stderr and "still in the log" in r.stderr
        r = d.dsh("attach", sid, "--call", "big-call")
        assert "was removed by max_state_bytes" in r.stderr, (r.stdout, r.stderr)
        # The logged result never changes.
        again = [json.loads(x) for x in d.dsh("log", sid, "--json").stdout.splitlines()]
        assert again[: len(logged)] == logged
        # It survives a restart, and fsck does not call it damage.
        d.stop()
        d.start()
        r = d.dsh("wait", sid, "big-call")
        assert "was removed by max_state_bytes" in r.stderr
        fsck = d.dsh("fsck", "--json")
        assert fsck.returncode == 0, (fsck.stdout, fsck.stderr)
        assert before["content"]  # the window the result logged is still what wait saw


def state_bytes(state_dir: Path) -> int:
    """The state's size as a person checks it: ``du -sb`` (files and directories)."""
    out = subprocess.run(["du", "-sb", str(state_dir)], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[0])


def test_retention_removes_the_oldest_output_first_and_only_what_it_must(workdir):
    with running_daemon("max_state_bytes = 0\n") as d:
        big = "head -c 400000 /dev/zero | tr '\\0' z"
        r = d.dsh("run", "--call-id", "older", "--", "sh", "-c", big, cwd=str(workdir))
        sid = session_of(r)
        time.sleep(0.05)  # the settled markers' mtimes order the two calls
        assert d.dsh("run", "--session", sid, "--call-id", "newer", "--", "sh", "-c", big,
                     cwd=str(workdir)).returncode == 0
        d.stop()
        # Over the bound by less than one call's output: only the older one must go.
        bound = state_bytes(d.state_dir) - 1000
        Path(d.extra_args[1]).write_text(f"max_state_bytes = {bound}\n")
        d.start()
        calls = d.state_dir / "sessions" / sid / "calls"
        until(lambda: (calls / "older" / "output.removed").exists(), "the older output removed")
        assert not (calls / "newer" / "output.removed").exists()
        assert (calls / "newer" / "output.raw").stat().st_size == 400_000
        r = d.dsh("wait", sid, "newer")
        assert r.returncode == 0 and len(r.stdout) == 400_000


def test_prune_leaves_a_session_someone_is_attached_to(daemon, workdir):
    sid = session_of(daemon.dsh("run", "--", "true", cwd=str(workdir)))
    watcher = subprocess.Popen([sys.executable, "-m", "client.cli", "attach", "-f", sid],
                               env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL)
    try:
        def skipped():
            out = json.loads(daemon.dsh("prune", "--older-than", "0s", "--dry-run",
                                        "--json").stdout)
            return {"sessionId": sid, "reason": "attached"} in out["skipped"]
        until(skipped, "the attached session skipped")
        r = daemon.dsh("prune", "--older-than", "0s")
        assert f"skipped {sid}: attached" in r.stdout and sid in listed(daemon)
    finally:
        watcher.kill()
        watcher.wait(10)
    until(lambda: f"deleted {sid}" in daemon.dsh("prune", "--older-than", "0s").stdout,
          "the session pruned once nobody watches it")
    assert sid not in listed(daemon)


def test_prune_dry_run_counts_the_bytes_the_real_prune_frees(daemon, workdir):
    """A dry run and the real prune of the same sessions answer the same freedBytes: what the
    sessions held when the prune looked (a real delete first closes the session, whose last
    snapshot and summary go with it, and were never the user's to free)."""
    sids = []
    for i in range(4):
        if i == 2:
            daemon.restart()  # the first two are closed sessions now, the others open
        sid = session_of(daemon.dsh("run", "--", "sh", "-c", f"seq 1 {2000 * (i + 1)}",
                                    cwd=str(workdir)))
        for j in range(3):
            assert daemon.dsh("run", "--session", sid, "--", "echo", f"more {j}").returncode == 0
        sids.append(sid)
    time.sleep(1.1)
    dry = json.loads(daemon.dsh("prune", "--older-than", "1s", "--dry-run", "--json").stdout)
    assert sorted(dry["deleted"]) == sorted(sids) and dry["freedBytes"] > 0
    real = json.loads(daemon.dsh("prune", "--older-than", "1s", "--json").stdout)
    assert sorted(real["deleted"]) == sorted(sids)
    assert real["freedBytes"] == dry["freedBytes"], (dry, real)


def test_settled_output_nudges_a_pass_long_before_the_interval(workdir):
    # The interval is a day: only the output the calls settle with can wake retention, and it
    # must, or a bound set for a busy day is passed by an hour of output before a pass comes.
    bound = 700_000
    config = f"max_state_bytes = {bound}\nretention_interval_seconds = 86400\n"
    with running_daemon(config) as d:
        big = "head -c 300000 /dev/zero | tr '\\0' n"
        r = d.dsh("run", "--call-id", "first", "--", "sh", "-c", big, cwd=str(workdir))
        assert r.returncode == 0, r.stderr
        sid = session_of(r)
        for n in range(2, 6):
            r = d.dsh("run", "--session", sid, "--call-id", f"call-{n}", "--", "sh", "-c", big,
                      cwd=str(workdir))
            assert r.returncode == 0, r.stderr
        first = d.state_dir / "sessions" / sid / "calls" / "first"
        until(lambda: (first / "output.removed").exists(), "the oldest output removed by a "
              "pass the settled output woke")
        until(lambda: any(rec["state_bytes"] <= bound
                          for rec in log_lines(d, "retention.output_removed")),
              "a pass that left the state under its bound")
        assert list((d.state_dir / "sessions" / sid / "calls" / "call-5").glob("output.raw*"))
