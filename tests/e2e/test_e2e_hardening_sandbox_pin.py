"""Sandbox holes of issue 11, against a real ``dshd`` over its socket (real bwrap, real Landlock).

* item 1 — the session directory is pinned by fd: a process renaming a directory of its path
  for a symlink while calls start (bounded: 10 s of swapping, 40 calls) never gets a call's
  writable workspace bound (bwrap) or ruled (Landlock) somewhere else;
* item 2 — a stray name under ``<state>/sandbox/landlock-tmp`` neither stops the daemon's start
  nor any Landlock call;
* item 3 — the private /tmp budget holds for concurrent calls: of three concurrent long calls
  under a budget of two, the third fails closed, stays refused while the two run (>10 s, with a
  count — the only garbage collection of leases — at each refused call), and runs after one
  ended.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio

from client.api import connect
from dshd.testing import DshdProcess

PROVIDERS = ["bwrap", "landlock"]

#: The swapper: renames ``sub2`` away and puts a symlink to ``target`` in its place, and back,
#: every 3 ms, for ``seconds`` (the attacker's loop of the report, bounded).
SWAPPER = """
import os, sys, time
os.chdir(sys.argv[1]); target = sys.argv[2]; end = time.time() + float(sys.argv[3])
print("swapping", flush=True)
while time.time() < end:
    os.rename("sub2", "real"); os.symlink(target, "sub2"); time.sleep(0.003)
    os.unlink("sub2"); os.rename("real", "sub2"); time.sleep(0.003)
"""


class Daemon:
    """A daemon with a forced provider, its state under a fresh directory in /var/tmp."""

    def __init__(self, provider: str, extra_config: str = "", before_start=None) -> None:
        # Under /var/tmp, not /tmp: bwrap's private /tmp must not be what protects anything.
        self.root = Path(tempfile.mkdtemp(prefix="dsh-p-", dir="/var/tmp"))
        self.state = self.root / "state"
        self.socket = self.root / "run" / "dshd.sock"
        self.socket.parent.mkdir()
        cfg = self.root / "dshd.toml"
        cfg.write_text(f'sandbox_provider = "{provider}"\n{extra_config}')
        if before_start is not None:
            before_start(self)
        self.daemon = DshdProcess(self.root, state_dir=self.state, socket_path=self.socket,
                                  extra_args=["--config", str(cfg)])
        try:
            self.daemon.start()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def close(self) -> None:
        self.daemon.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def daemon_of():
    made: list[Daemon] = []

    def make(provider: str, extra_config: str = "", before_start=None) -> Daemon:
        d = Daemon(provider, extra_config, before_start)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


async def _run(c, sid: str, command: str) -> dict:
    return await c.wait(sid, await c.run_tool(sid, command, approved=True))


# ------------------------------------------------------------------------------- item 1
@pytest.mark.parametrize("target", ["outside", "state-parent"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_workspace_path_swapped_for_a_symlink_is_never_what_gets_bound(
        daemon_of, provider, target):
    """Issue 11 item 1: a victim session in ``wsD/sub2`` while ``sub2`` is swapped for a symlink
    to a writable host directory outside (or to the state directory's parent) for 10 s; each of
    40 calls writes a file named after its call id into its cwd. Before: 7/40 (bwrap) and 6/40
    (Landlock) calls wrote outside. Now: every write lands in the real workspace or the call
    fails closed — none outside, none in the state directory."""
    d = daemon_of(provider)
    wsd = d.root / "wsD"
    (wsd / "sub2").mkdir(parents=True)
    outside = d.root / "outside"
    outside.mkdir()
    aim = outside if target == "outside" else d.state.parent
    async with connect(d.socket) as c:
        victim = await c.create_session(str(wsd / "sub2"))
        warm = await _run(c, victim, "echo warm > warm && echo ok")
        assert warm["exitCode"] == 0, warm
        swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(wsd), str(aim), "10"],
                                   stdout=subprocess.PIPE, text=True)
        try:
            assert swapper.stdout.readline() == "swapping\n"
            results = []
            for _ in range(40):
                results.append(await _run(
                    c, victim, 'echo pwned > "./WIN_$DSH_CALL_ID" && echo WROTE; pwd'))
        finally:
            swapper.kill()
            swapper.wait()
    if (wsd / "real").is_dir():  # the swapper was killed mid-swap
        if (wsd / "sub2").is_symlink():
            (wsd / "sub2").unlink()
        (wsd / "real").rename(wsd / "sub2")
    escaped = sorted(str(p) for p in aim.rglob("WIN_*") if wsd not in p.parents)
    print(f"\nESCAPED {provider}/{target}: {len(escaped)}/40")
    assert escaped == [], escaped
    inside = [p.name for p in (wsd / "sub2").iterdir() if p.name.startswith("WIN_")]
    refused = [r for r in results if r.get("errorCode") == "SANDBOX_UNAVAILABLE"]
    for r in refused:  # a swap caught by dshd's check: fail closed, naming the path
        assert str(wsd / "sub2") in r["content"], r
    wrote = [r for r in results if "WROTE" in r["content"]]
    assert len(wrote) == len(inside), (wrote, inside)  # every write that ran landed inside
    # The rest failed closed before the command ran — bwrap could not mount at a path that was
    # a symlink at that instant, or the directory was gone at spawn (TOOL_FAILED) — or (bwrap)
    # ran with its cwd on the read-only tree: ``--chdir`` took the symlink, which inside the
    # sandbox leads to a read-only mount (only the pinned workspace is writable there).
    read_only = [r for r in results if "Read-only file system" in r["content"]]
    assert provider == "bwrap" or not read_only, read_only
    for r in results:
        if r not in refused and r not in wrote and r not in read_only:
            assert r.get("exitCode") != 0 and "WROTE" not in r["content"], r
    print(f"\n{provider}/{target}: {len(wrote)} wrote in the workspace, {len(refused)} "
          f"refused by dshd, {len(read_only)} ran in a read-only cwd, "
          f"{40 - len(wrote) - len(refused) - len(read_only)} failed in setup, 0 outside")
    async with connect(d.socket) as c:  # the swapping over: the session works as before
        after = await _run(c, victim, "echo after > after && echo WROTE")
    assert after["exitCode"] == 0 and (wsd / "sub2" / "after").is_file(), after


# ------------------------------------------------------------------------------- item 2
def _stray(d: Daemon) -> None:
    for name in ("99999999999999999999-x", "12-not-ours", "\u00b2-x", "0-000000000000"):
        (d.state / "sandbox" / "landlock-tmp" / name).mkdir(parents=True, exist_ok=True)


async def test_a_stray_name_in_landlock_tmp_stops_neither_the_daemon_nor_a_call(daemon_of):
    """Issue 11 item 2: ``99999999999999999999-x`` under ``landlock-tmp`` made collect_garbage
    raise ``OverflowError`` — the daemon died in its probe, and every Landlock call failed with a
    traceback. Names the launcher did not make are left alone."""
    d = daemon_of("landlock", before_start=_stray)
    async with connect(d.socket) as c:
        assert (await c.status())["sandbox"]["provider"] == "landlock"
        work = d.root / "project"
        work.mkdir()
        sid = await c.create_session(str(work))
        (d.state / "sandbox" / "landlock-tmp" / "88888888888888888888888-y").mkdir()
        for _ in range(3):
            result = await _run(c, sid, "echo ran")
            assert result["exitCode"] == 0 and result["content"] == "ran\n", result
    assert (d.state / "sandbox" / "landlock-tmp" / "99999999999999999999-x").is_dir()


# ------------------------------------------------------------------------------- item 3
@pytest.mark.parametrize("count", [3, 6])
async def test_concurrent_calls_under_a_budget_of_two(daemon_of, count):
    """Issue 11 item 3: 20 concurrent calls all started under a budget of ~14: a count made
    while a starting call's bwrap had marked its lease started but not yet locked it removed
    the lease (before the fix, 5 of 8 back-to-back calls started under a budget of 2). Budget
    for exactly two calls; ``count`` concurrent long calls: all but two fail closed; a call
    every 2 s while the two run for >10 s is refused each time (each refusal is a count, the
    only garbage collection of leases); after one ends, a call runs."""
    mib = 1024 * 1024
    # per call: /tmp 8 MiB + /dev/shm 8 MiB + /run 4 MiB = 20 MiB; room for two calls.
    d = daemon_of("bwrap", f"tmp_size_bytes = {8 * mib}\ntmp_total_bytes = {45 * mib}\n")
    work = d.root / "project"
    work.mkdir()
    hold = ("touch started-$DSH_CALL_ID; while [ ! -e stop-$DSH_CALL_ID ]; do sleep 0.05; done; "
            "echo held")
    async with connect(d.socket) as c:
        sid = await c.create_session(str(work))
        cids = [await c.run_tool(sid, hold, approved=True) for _ in range(count)]
        refused, running = [], []
        with trio.fail_after(60):
            while len(refused) + len(running) < count:
                for cid in cids:
                    if cid in refused or cid in running:
                        continue
                    if (work / f"started-{cid}").exists():
                        running.append(cid)
                        continue
                    try:
                        result = await c.wait(sid, cid, timeout=0.05)
                    except Exception:  # still running, not yet started
                        continue
                    assert result["errorCode"] == "SANDBOX_UNAVAILABLE", result
                    assert "tmp_total_bytes" in result["content"], result
                    refused.append(cid)
                await trio.sleep(0.05)
        await trio.sleep(1)  # a call that slipped through would show up by now
        running = [cid for cid in cids if (work / f"started-{cid}").exists()]
        assert len(running) == 2 and len(refused) == count - 2, (running, refused)
        end = time.monotonic() + 12
        tries = 0
        while time.monotonic() < end:
            again = await _run(c, sid, "echo ran")
            assert again.get("errorCode") == "SANDBOX_UNAVAILABLE", again
            tries += 1
            await trio.sleep(2)
        leases = os.listdir(d.state / "sandbox" / "tmp-leases")
        assert len([n for n in leases if n.startswith("lease-")]) == 2, leases
        (work / f"stop-{running[0]}").touch()
        assert (await c.wait(sid, running[0]))["exitCode"] == 0
        after = await _run(c, sid, "echo ran")
        assert after["exitCode"] == 0 and after["content"] == "ran\n", after
        (work / f"stop-{running[1]}").touch()
        assert (await c.wait(sid, running[1]))["exitCode"] == 0
    assert tries >= 5


def test_a_session_created_through_a_symlink_stores_the_resolved_directory(tmp_path):
    """Each call pins the session directory by fd and refuses a path that leads elsewhere, so
    session.create stores the cwd resolved: a client that sends a symlinked path (not the
    CLI: it sends getcwd()) still gets a working session, at the real directory."""
    from dshd.testing import DshdProcess

    from .wire import Wire

    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    (tmp_path / "d").mkdir()
    d = DshdProcess(tmp_path / "d")
    d.start()
    try:
        w = Wire(d.socket)
        sid = w.result("session.create", {"cwd": str(link)})["sessionId"]
        assert w.result("session.get", {"sessionId": sid})["cwd"] == str(real)
        w.result("tool.run", {"sessionId": sid, "name": "bash", "callId": "c1", "approved": True,
                              "arguments": {"command": "pwd; echo x > made"}})
        result = w.result("tool.wait", {"sessionId": sid, "callId": "c1", "timeout": 60})
        assert result["exitCode"] == 0, result
        assert result["content"].splitlines()[0] == str(real)
        assert (real / "made").read_text() == "x\n"
        w.close()
    finally:
        d.close()
