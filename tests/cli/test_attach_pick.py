"""``dsh attach`` through the real CLI (issue 15 items 3 and 4): with no SESSION it prefers
the newest session of the directory with a running call (``session.find``'s ``running``) and
says so; ``--call`` of a settled call prints a sensible header, then its output and result."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.cli.test_cleanup_cli import session_of, until

LIVENESS = 30.0


def sessions(d) -> list[dict]:
    out = json.loads(d.dsh("--json", "sessions").stdout)
    return out["sessions"] if isinstance(out, dict) else out


def test_attach_without_a_session_prefers_the_one_with_a_running_call(daemon, workdir):
    out, err = workdir.parent / "att.out", workdir.parent / "att.err"
    runner = subprocess.Popen(
        [sys.executable, "-m", "client.cli", "run", "--", "sh", "-c",
         "echo up; while [ ! -e go ]; do sleep 0.05; done; echo down"],
        env=daemon.env, cwd=str(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True)
    attach = None
    try:
        busy = until(lambda: next((s["sessionId"] for s in sessions(daemon) if s.get("running")),
                                  None), "the running session")
        time.sleep(0.01)  # the idle one is made after: it is the newest
        idle = daemon.dsh("run", "--", "true", cwd=str(workdir))
        assert idle.returncode == 0, idle.stderr
        idle_sid = session_of(idle)
        assert idle_sid != busy
        attach = subprocess.Popen([sys.executable, "-m", "client.cli", "attach"],
                                  env=daemon.env, cwd=str(workdir), stdout=out.open("wb"),
                                  stderr=err.open("wb"), stdin=subprocess.DEVNULL)
        until(lambda: "up" in out.read_text(), "the running call's output")
        (workdir / "go").touch()
        assert attach.wait(LIVENESS) == 0, err.read_text()
        runner.communicate(timeout=LIVENESS)
    finally:
        for proc in (runner, attach):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
    notes = err.read_text()
    assert f"using session {busy}" in notes and "with a running call or turn" in notes, notes
    assert out.read_text() == "up\ndown\n"
    # With nothing running, the newest session of the directory (by updatedAt), as before.
    newest = max(sessions(daemon), key=lambda s: (s["updatedAt"], s["sessionId"]))
    r = daemon.dsh("attach", cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    first = r.stderr.splitlines()[0]
    assert f"using session {newest['sessionId']}" in first and "running call" not in first


def test_attach_call_of_a_settled_call_prints_a_sensible_header(daemon, workdir):
    r = daemon.dsh("run", "--call-id", "c1", "--", "echo", "hi", cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    sid = session_of(r)
    a = daemon.dsh("attach", sid, "--call", "c1")
    assert a.returncode == 0, a.stderr
    assert a.stdout == "hi\n"
    header = next(line for line in a.stderr.splitlines() if line.startswith("── call c1"))
    assert header == "── call c1 (settled: its output and result follow)", a.stderr
    assert "null" not in a.stderr and "(?," not in a.stderr
