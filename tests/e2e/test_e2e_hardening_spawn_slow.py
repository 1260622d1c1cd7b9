"""Issue 10, the spawn side, tests that must wait (items 1 and 7), marked ``slow`` so that they
can run in parallel later; they run in ``make test`` like every other test.

* Item 1: a call silent for longer than trio's idle worker-thread lifetime (10 s) is not killed:
  bwrap's ``--die-with-parent`` (PR_SET_PDEATHSIG) fires when the *thread* that forked bwrap
  exits, so the spawn must come from a thread that lives as long as the daemon.
* Item 7: a fork bomb in one session under a real pids limit (RLIMIT_NPROC of an unprivileged
  daemon user) makes other sessions' spawns fail closed with the real reason — never a crash
  of a session or the daemon — and every ``tool.wait`` returns.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import DaemonProcess, throwaway_user
from .spawn_rpc import Daemon

pytestmark = pytest.mark.slow

SILENT = "sh -c 'sleep 60; echo done; exit 3'"


# ---------------------------------------------------------------------- item 1
@pytest.mark.parametrize("provider", ["bwrap", "landlock"])
def test_a_call_silent_for_60_s_completes(provider, workdir):
    with Daemon(f'sandbox_provider = "{provider}"\n') as d:
        rpc = d.rpc()
        sid = rpc.session(workdir)
        started = time.monotonic()
        result = rpc.run(sid, SILENT)
        assert time.monotonic() - started >= 60
        assert result["content"] == "done\n", result
        assert result["exitCode"] == 3 and result.get("errorCode") is None, result
        rpc.close()


def test_dsh_run_of_a_15_s_silent_command_exits_with_its_code(workdir):
    root = Path(tempfile.mkdtemp(prefix="dsh-spawn-cli-"))
    d = DaemonProcess(root)
    d.start()
    try:
        r = d.dsh("run", "--", "sh", "-c", "sleep 15; echo done; exit 7", cwd=str(workdir),
                  timeout=120)
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)
    assert r.returncode == 7, (r.returncode, r.stdout, r.stderr)
    assert "done" in r.stdout


# ---------------------------------------------------------------------- item 7
BOMB_USER = "dshspawnbomb"
NPROC = 48


@pytest.fixture
def bomb_user():
    # RLIMIT_NPROC is tested on a throw-away user (root is exempt from it).
    with throwaway_user(BOMB_USER, system=True,
                        tools=("useradd", "userdel", "setpriv", "prlimit", "perl")) as entry:
        yield entry


def _interpreter_for(user: pwd.struct_passwd) -> tuple[str, dict[str, str]]:
    """A Python the throw-away user can exec (its children too: the Landlock launcher runs on
    the daemon's interpreter), with this run's packages on ``PYTHONPATH``."""
    import site
    import sys

    probe = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                            "--clear-groups", "env", sys.executable, "-c", "pass"],
                           capture_output=True)
    if probe.returncode == 0:
        return sys.executable, {}
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip(f"the test user cannot exec {sys.executable} and there is no system python3")
    version = subprocess.run([system, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    if version != str(tuple(sys.version_info[:2])):
        pytest.skip(f"the test user cannot exec {sys.executable}; {system} is another version")
    paths = [os.getcwd(), *site.getsitepackages()]
    return system, {"PYTHONPATH": ":".join(paths)}


def _limited_daemon(user: pwd.struct_passwd, provider: str) -> tuple[Daemon, Path]:
    root = Path(tempfile.mkdtemp(prefix="dsh-bomb-", dir="/var/tmp"))
    root.chmod(0o755)
    for sub in ("a", "b", "run", "state"):
        (root / sub).mkdir()
    for path in [root, *root.iterdir()]:
        os.chown(path, user.pw_uid, user.pw_gid)
    python, extra_env = _interpreter_for(user)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "LANG": "C.UTF-8",
           **extra_env}
    prefix = ["prlimit", f"--nproc={NPROC}", "--",
              "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    d = Daemon(f'sandbox_provider = "{provider}"\n', env=env, prefix=prefix, root=root,
               python=python)
    os.chown(root / "dshd.toml", user.pw_uid, user.pw_gid)
    return d, root


RESOURCE_WORDS = ("resource limit", "EAGAIN")
#: Forks without backing off (bash's own fork retry sleeps up to 16 s, so a slot freed by a
#: finished call went back to the daemon and the limit was never held): every freed slot is
#: taken again at once, and each child holds one for two minutes (or until the cancel).
BOMB = ("perl -e 'while (1) { my $p = fork(); if (defined $p && $p == 0) { sleep 120; exit } }' "
        "2>/dev/null")


@pytest.mark.parametrize("provider", ["bwrap", "landlock"])
def test_a_fork_bomb_in_one_session_fails_others_closed_never_crashes(bomb_user, provider):
    d, root = _limited_daemon(bomb_user, provider)
    with d:
        rpc = d.rpc()
        assert rpc.server["sandbox"]["provider"] == provider, rpc.server
        a = rpc.session(root / "a")
        b = rpc.session(root / "b")
        assert rpc.run(b, "echo before")["content"] == "before\n"
        bomb = rpc.start(a, BOMB)
        failures, successes = [], 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(failures) < 3:
            result = rpc.run(b, "echo hi")  # tool.wait must always return (the client bounds it)
            if result.get("exitCode") == 0 and result["content"] == "hi\n":
                successes += 1
                continue
            assert result["isError"] and result.get("errorCode") == "TOOL_FAILED", result
            sentence = result.get("message") or result["content"]
            assert any(w in sentence for w in RESOURCE_WORDS), result
            failures.append(sentence)
            time.sleep(0.2)
        assert failures, f"the bomb never exhausted the pids limit ({successes} calls ran)"
        assert rpc.result("tool.cancel", {"sessionId": a, "callId": bomb})["cancelled"]
        settled = rpc.wait(a, bomb)
        assert settled["errorCode"] == "TOOL_CANCELLED", settled
        # The limit is free again: session B runs, and the daemon never went down.
        deadline = time.monotonic() + 60
        while True:
            result = rpc.run(b, "echo after")
            if result.get("exitCode") == 0:
                break
            assert time.monotonic() < deadline, result
            time.sleep(0.5)
        assert result["content"] == "after\n"
        assert d.running and rpc.result("daemon.status")
        rpc.close()
        log = d.log_path.read_text(errors="replace")
    assert "session.crashed" not in log and "Traceback" not in log, log[-3000:]
