"""Issue 10 item 7 under a real limit: a fork bomb in one session's tool fills the daemon
user's RLIMIT_NPROC, so dshd cannot start a worker thread for an unrelated session's flush.
That session's calls fail closed with the real reason (STORAGE_FAILURE naming the limit),
tool.wait answers, and once the bomb is gone the known result is the one on disk -- never a
repaired TOOL_OUTCOME_UNKNOWN.

dshd runs as a throw-away unprivileged user (useradd, setpriv) under ``prlimit --nproc``; the
calls run ``danger-full-access`` (bwrap's own forks are the spawn room's business). The bomb
stops itself when a stop file appears (or after 90 s), so everything it started exits alone.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import trio

from client.api import connect
from dshd.storage import read_log
from dshd.testing import DshdProcess
from protocol.rpc import STORAGE_FAILURE, RpcError

from .conftest import throwaway_user

USER = "dshnproctest"
BOMB_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"  # the tool's own
LIMIT = 64  # tasks (processes + threads) of the user; the idle daemon uses a handful

BOMB = r"""
import os, sys, time
stop, full = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 90
kids, announced = [], False
while time.monotonic() < deadline and not os.path.exists(stop) and len(kids) < 400:
    try:
        pid = os.fork()
    except OSError:  # EAGAIN: the user's limit; keep grabbing every slot that frees up
        if not announced:
            with open(full, "w") as f:
                f.write(str(len(kids)))
            announced = True
        time.sleep(0.01)
        continue
    if pid == 0:
        while not os.path.exists(stop) and time.monotonic() < deadline:
            time.sleep(0.2)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("held", len(kids))
"""


@pytest.fixture
def limited_user():
    with throwaway_user(USER, system=True,
                        tools=("useradd", "userdel", "setpriv", "prlimit")) as entry:
        yield from _limited_root(entry)


def _limited_root(entry: pwd.struct_passwd):
    root = Path(tempfile.mkdtemp(prefix="dsh-nproc-", dir="/var/tmp"))
    root.chmod(0o755)
    (root / "work").mkdir()
    for path in (root, root / "work"):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    yield entry, root
    (root / "work" / "stop").touch()
    shutil.rmtree(root, ignore_errors=True)


class LimitedDshd(DshdProcess):
    def __init__(self, root: Path, user: pwd.struct_passwd) -> None:
        super().__init__(root)
        self.user = user

    def command(self) -> list[str]:
        return ["prlimit", f"--nproc={LIMIT}:{LIMIT}", "setpriv", f"--reuid={self.user.pw_uid}",
                f"--regid={self.user.pw_gid}", "--clear-groups", *super().command()]

    def spawn(self) -> subprocess.Popen:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root),
               "LANG": "C.UTF-8"}
        with open(self.log_path, "ab") as log:
            os.chown(self.log_path, self.user.pw_uid, self.user.pw_gid)
            return subprocess.Popen(self.command(), stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL, env=env)


async def _wait_for(path: Path, seconds: float) -> None:
    with trio.fail_after(seconds):
        while not path.exists():
            await trio.sleep(0.05)


async def test_fork_bomb_in_one_session_fails_another_closed_with_the_reason(limited_user):
    user, root = limited_user
    work = root / "work"
    (work / "bomb.py").write_text(BOMB)
    daemon = LimitedDshd(root, user)
    daemon.start()
    try:
        async with connect(daemon.socket) as c:
            opts = dict(sandbox="danger-full-access", approval_policy="never")
            bomber = await c.create_session(str(work), title="bomber", **opts)
            victim = await c.create_session(str(work), title="victim", **opts)
            warm = await c.run_tool(victim, "echo warm")
            assert (await c.wait(victim, warm))["content"] == "warm\n"
            bomb = await c.run_tool(
                bomber, f"exec {BOMB_PYTHON} {work / 'bomb.py'} {work / 'stop'} {work / 'full'}")
            await _wait_for(work / "full", 60)
            # trio's idle worker threads exit after 10 s; the bomb takes their slots.
            await trio.sleep(12)
            marker = "m" + secrets.token_hex(4)
            hit = await c.run_tool(victim, f"echo {marker} > {marker}")
            with trio.fail_after(30):  # tool.wait answers: never a hang
                try:
                    during = await c.wait(victim, hit)
                except RpcError as exc:
                    during = exc
            (work / "stop").touch()
            with trio.fail_after(60):
                held = await c.wait(bomber, bomb)
            assert held["exitCode"] == 0 and held["content"].startswith("held ")
            with trio.fail_after(30):
                after = await c.wait(victim, hit)
            again = await c.run_tool(victim, "echo again")
            assert (await c.wait(victim, again))["content"] == "again\n"
        log_text = daemon.log_path.read_text(errors="replace")
    finally:
        (work / "stop").touch()
        daemon.stop()
    assert "session.crashed" not in log_text
    if isinstance(during, RpcError):
        assert during.code == STORAGE_FAILURE and "RLIMIT_NPROC" in during.message
    else:  # the daemon knew before the bomb left: it never started, and says why
        assert during["errorCode"] in ("STORAGE_FAILURE", "TOOL_FAILED"), during
    assert after["errorCode"] in ("STORAGE_FAILURE", "TOOL_FAILED"), after
    assert "can't start new thread" in after["content"] or "RLIMIT_NPROC" in after["content"]
    assert not (work / marker).exists()  # it never ran
    on_disk = [e.data for e in read_log(daemon.state_dir / "sessions" / victim, victim).events
               if e.type == "tool/result" and e.data["callId"] == hit]
    assert on_disk == [after]  # the known result, not TOOL_OUTCOME_UNKNOWN
    assert "RLIMIT_NPROC" in log_text  # the real reason is in the daemon's log too
