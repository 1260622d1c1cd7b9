"""An upgrade across two builds that both have the detaching call host (issue 13 "Must
show"): calls started under the older dshd keep running when HEAD replaces it and settle with
their exit codes; replacing HEAD by the older build again keeps every session readable.

Theory: the older build is the tree of commit :data:`DETACH_SINCE` (env ``DSH_DETACH_SINCE``
overrides), exported with ``git archive`` into a scratch directory (the same files a ``git
worktree add`` checks out, without registering a worktree in the repository a crashed test
would leave behind) and run from it with ``PYTHONPATH`` set to it (``python -m`` puts the working directory
first), so that ``python -m dshd`` and the
call host it starts (``python3 -I -S <tree>/dshd/callhost/main.py``) are the older code. Both
builds share one socket and one state directory, as a package upgrade does. The test skips
only when this checkout is not a git repository (no history to build from); a commit that is
missing is a failure that says so.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from client.api import connect
from dshd.testing import DshdProcess

REPO = Path(__file__).resolve().parents[2]
#: The older build: the first commit whose dshd detaches on stop and re-adopts on start.
#: Room adopt's commit this test was written against; the lead replaces it with main's.
DETACH_SINCE = os.environ.get("DSH_DETACH_SINCE") or "b62f2ed"
#: (exit code, seconds) of the calls started under the older build.
CALLS = {"seven": (7, 8), "zero": (0, 5), "three": (3, 2)}


class BuildProcess(DshdProcess):
    """A ``DshdProcess`` that runs the dshd of another tree (``PYTHONPATH``)."""

    def __init__(self, root: Path, tree: Path | None) -> None:
        super().__init__(root)
        self.tree = tree

    def spawn(self) -> subprocess.Popen:
        env = dict(os.environ, DSH_SOCKET=str(self.socket), DSH_STATE_DIR=str(self.state_dir))
        if self.tree is not None:
            env["PYTHONPATH"] = str(self.tree)
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(self.command(), stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL, env=env, cwd=self.tree or REPO)


def _older_tree(dest: Path) -> Path:
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "--git-dir"],
                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: no older build to upgrade from")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet",
                             f"{DETACH_SINCE}^{{commit}}"], capture_output=True, text=True)
    assert commit.returncode == 0, (
        f"DETACH_SINCE={DETACH_SINCE} is not a commit of this repository: set DSH_DETACH_SINCE "
        "(or the constant) to the first commit whose dshd detaches")
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit.stdout.strip()],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    where = subprocess.run([sys.executable, "-c", "import dshd; print(dshd.__file__)"],
                           env=dict(os.environ, PYTHONPATH=str(dest)), cwd=dest,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where == str(dest / "dshd" / "__init__.py"), where  # the older code is what runs
    return dest


@pytest.fixture
def builds():
    root = Path(tempfile.mkdtemp(prefix="dshup-"))
    made: list[BuildProcess] = []
    try:
        old = _older_tree(root / "old")

        def make(which: str) -> BuildProcess:
            d = BuildProcess(root, old if which == "old" else None)
            made.append(d)
            return d

        yield make, root
    finally:
        for d in made:
            d.stop()
        DshdProcess(root).close()  # every call host under the shared state dir
        shutil.rmtree(root, ignore_errors=True)


def _command(code: int, seconds: int) -> str:
    return f"for i in $(seq 1 {seconds}); do echo line-$i; sleep 1; done; exit {code}"


async def _start_calls(d: DshdProcess, workspace: Path) -> str:
    async with connect(d.socket, "upgrade-test") as c:
        sid = (await c.call("session.create", {"cwd": str(workspace)}))["sessionId"]
        for cid, (code, seconds) in CALLS.items():
            await c.call("tool.run", {"sessionId": sid, "name": "bash", "callId": cid,
                                      "approved": True,
                                      "arguments": {"command": _command(code, seconds)}})
        for cid in CALLS:  # each one running (its first line out) before the old build stops
            with trio.fail_after(60):
                while "line-1" not in await _window(c, sid, cid):
                    await trio.sleep(0.05)
    return sid


async def _window(c, sid: str, cid: str) -> str:
    read = await c.call("tool.read", {"sessionId": sid, "callId": cid, "offset": 0})
    return base64.b64decode(read.get("data", "")).decode(errors="replace")


async def _events(c, sid: str) -> list[dict]:
    out, after = [], -1
    while True:
        page = await c.call("session.events", {"sessionId": sid, "afterSeq": after})
        out += page["events"]
        if not page["events"]:
            return out
        after = page["events"][-1]["seq"]


async def test_calls_started_under_the_older_build_settle_under_head_and_back(builds):
    make, root = builds
    workspace = root / "ws"
    workspace.mkdir()
    old = make("old")
    old.start()
    sid = await _start_calls(old, workspace)
    for cid in CALLS:  # each call's host is the older build's callhost/main.py
        pid = json.loads((old.state_dir / "sessions" / sid / "calls" / cid / "host.json")
                         .read_text())["pid"]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert str(old.tree / "dshd" / "callhost" / "main.py").encode() in cmdline, cmdline
    assert old.stop() == 0, old.log_tail()  # on_stop = "detach": the hosts run on

    head = make("head")
    head.start()
    async with connect(head.socket, "upgrade-test") as c:
        for cid, (code, seconds) in CALLS.items():
            with trio.fail_after(120):
                result = await c.call("tool.wait", {"sessionId": sid, "callId": cid})
            assert result.get("exitCode") == code and not result.get("errorCode"), result
            text = await _window(c, sid, cid)
            assert text.splitlines() == [f"line-{i}" for i in range(1, seconds + 1)], text
        # A call HEAD starts and that is still running when the older build comes back.
        await c.call("tool.run", {"sessionId": sid, "name": "bash", "callId": "late",
                                  "approved": True, "arguments": {"command": _command(5, 6)}})
        with trio.fail_after(60):
            while "line-1" not in await _window(c, sid, "late"):
                await trio.sleep(0.05)
        head_events = await _events(c, sid)
    assert head.stop() == 0, head.log_tail()

    again = make("old")
    again.start()
    async with connect(again.socket, "upgrade-test") as c:
        listed = (await c.call("session.list", {}))["sessions"]
        info = next(s for s in listed if s["sessionId"] == sid)
        assert "damaged" not in info, info
        events = await _events(c, sid)
        assert [e["seq"] for e in events] == list(range(len(events)))
        assert events[: len(head_events)] == head_events  # every event HEAD wrote, read back
        with trio.fail_after(120):
            late = await c.call("tool.wait", {"sessionId": sid, "callId": "late"})
        assert late.get("exitCode") == 5 and not late.get("errorCode"), late
        await c.call("tool.run", {"sessionId": sid, "name": "bash", "callId": "after",
                                  "approved": True, "arguments": {"command": "echo fine"}})
        after = await c.call("tool.wait", {"sessionId": sid, "callId": "after"})
        assert after.get("exitCode") == 0 and "fine" in after.get("content", ""), after
