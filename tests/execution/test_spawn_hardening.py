"""Spawn hardening pieces that a daemon test cannot reach on demand (issue 10 items 7, 20)."""

from __future__ import annotations

import errno
import os
import subprocess

from dshd.execution.spawn import INLINE_COMMAND_MAX, BashScript, spawn_sentence


def test_a_fork_at_a_resource_limit_names_the_limit():
    sentence = spawn_sentence(["bwrap"], "/", BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN)))
    assert "could not start a thread/process: resource limit" in sentence
    assert "EAGAIN" in sentence and "program exists" not in sentence


def test_a_long_script_goes_through_a_sealed_memfd(tmp_path):
    command = "echo " + "x" * (INLINE_COMMAND_MAX + 1) + " > out"
    script = BashScript(command)
    try:
        assert script.pass_fds and script.argv[-1] == f"/dev/fd/{script.fd}"
        try:
            with open(f"/proc/self/fd/{script.fd}", "r+b", buffering=0) as f:
                f.write(b"tampered")
            written = True
        except PermissionError:
            written = False
        assert not written  # sealed: the command cannot be changed after the audit pair
        subprocess.run(script.argv, cwd=tmp_path, pass_fds=script.pass_fds, check=True)
    finally:
        script.close()
    assert (tmp_path / "out").read_text() == "x" * (INLINE_COMMAND_MAX + 1) + "\n"
    assert script.fd is None


def test_a_short_script_stays_bash_c():
    script = BashScript("echo hi")
    assert script.argv[1:] == ["-c", "--", "echo hi"] and script.pass_fds == ()


# A run_command at a thread limit: the spawn takes the last task slot the user has, so the
# spill flush cannot start a worker thread ("can't start new thread") and writes in the trio
# thread instead of failing the call (issue 10 item 7, the spawn side).
THREADLESS = r'''
import os, sys, trio
from dshd.execution.capture import OutputCapture, ShellOutputLimits, SpillSink
from dshd.execution.process import run_command

async def main(spill_path):
    capture = OutputCapture(ShellOutputLimits(), SpillSink(spill_path))
    outcome = await run_command(
        ["sh", "-c", "head -c 300000 /dev/zero; sleep 1"], cwd="/", env={"PATH": "/usr/bin:/bin"},
        capture=capture, on_output=lambda: None, timeout=None, cancel=trio.Event())
    print(outcome.exit_code, outcome.error, os.path.getsize(spill_path))

trio.run(main, sys.argv[1])
'''

THREAD_USER = "dshspawnthread"


def test_a_spill_flush_without_a_worker_thread_writes_in_the_trio_thread():
    import pwd
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("useradd", "setpriv", "prlimit")):
        import pytest

        pytest.skip("needs root, useradd, setpriv and prlimit (RLIMIT_NPROC spares root)")
    try:
        pwd.getpwnam(THREAD_USER)
        created = False
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", THREAD_USER], check=True, capture_output=True)
        created = True
    user = pwd.getpwnam(THREAD_USER)
    try:
        area = Path(tempfile.mkdtemp(prefix="dsh-threadless-", dir="/var/tmp"))
        os.chown(area, user.pw_uid, user.pw_gid)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.getcwd()}
        # Three tasks for the user: this Python, the spawned `sh`, and its `head` (then its
        # `sleep`): no room for a worker thread while the output is read.
        r = subprocess.run(
            ["prlimit", "--nproc=3", "--", "setpriv", f"--reuid={user.pw_uid}",
             f"--regid={user.pw_gid}", "--clear-groups", sys.executable, "-c", THREADLESS,
             str(area / "spill.log")],
            capture_output=True, text=True, timeout=60, env=env, cwd="/",
        )
    finally:
        shutil.rmtree(area, ignore_errors=True)
        if created:
            subprocess.run(["userdel", THREAD_USER], check=False, capture_output=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["0", "None", "300000"], (r.stdout, r.stderr[-3000:])
