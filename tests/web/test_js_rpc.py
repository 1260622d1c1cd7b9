"""rpc.js under Node against a real dshd through a real ``dsh web`` bridge, and its reconnect.

Theory of operation: the fixtures of tests/web/conftest.py start ``dshd`` and ``dsh web``
(real subprocesses, real sockets). This test runs ``tests/web/js/rpc_live.mjs`` with
``node --experimental-websocket``: it exchanges the token for the cookie as a browser does,
opens the WebSocket with the right ``Origin`` and the cookie (undici's ``headers`` option),
and drives ``RpcConnection``, ``LaneView``, ``OutputFollower`` and ``readAll`` (the script's
docstring lists what it asserts). The script reports steps as JSON lines; at
``ready-for-kill`` this test SIGKILLs the bridge and starts it again on the same port and
token file (case ``bridge``), or stops dshd and starts it again on the same socket while the
bridge stays (case ``daemon``: the call's host outlives dshd, HOST.md §7), and at ``resumed`` (the script saw the drop, reconnected by itself, got a fresh
base batch and follow bytes past the drop's offset) it creates ``STOP`` in the session's cwd
so the still-running call ends. The script then compares every followed byte with
``tool.read``. Waits are liveness bounds. Skipped only when ``node`` is not installed.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "web" / "js" / "rpc_live.mjs"
NODE = shutil.which("node")
STEP_TIMEOUT_S = 90.0

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed (apt install nodejs, >= 20): rpc.js is tested under it"
)


class NodeScript:
    """The Node process and its JSON lines (read by a thread into a queue)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [NODE, "--experimental-websocket", "--no-warnings", str(SCRIPT)], cwd=ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        self._err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self._err.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, what: str) -> dict:
        """The next JSON line, which must be step ``what`` (or the final ``ok`` object)."""
        try:
            line = self.lines.get(timeout=STEP_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"node said nothing for {STEP_TIMEOUT_S} s waiting for {what}: {self.report()}")
        if line is None:
            raise AssertionError(f"node ended before {what}: {self.report()}")
        msg = json.loads(line)
        self.seen.append(msg)
        if msg.get("ok") is False:
            raise AssertionError(f"rpc_live.mjs failed at {what}:\n{msg['error']}\n{self.report()}")
        assert msg.get("step", "ok" if "ok" in msg else None) == what, f"expected {what}, got {msg}"
        return msg

    def report(self) -> str:
        return f"seen={self.seen} stderr={''.join(self._err)[-3000:]}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.mark.parametrize("what", ["bridge", "daemon"])
def test_rpc_js_mirrors_follows_and_rides_through_a_restart(what, web_daemon, bridge, tmp_path):
    """``bridge``: SIGKILL ``dsh web`` and start it again on the same port. ``daemon``: stop
    dshd (SIGTERM: its calls' hosts run on, HOST.md §7) and start it again on the same socket
    while the bridge stays: the WebSocket closes 4000, then 4001 while dshd is down."""
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, DSH_WEB_BASE=bridge.base, DSH_WEB_TOKEN=bridge.token, DSH_WEB_CWD=str(work),
               DSH_WEB_MODE=what)
    node = NodeScript(env)
    try:
        node.next("initialized")
        node.next("phase1")
        node.next("ready-for-kill")
        if what == "bridge":
            bridge.kill()
            assert not bridge.running
            bridge.start()  # same port, same token file: the cookie still works
        else:
            web_daemon.restart()
        resumed = node.next("resumed")
        assert resumed["end"] > resumed["offsetAtDrop"]
        (work / "STOP").touch()
        final = node.next("ok")
        print(f"rpc_live figures ({what} restart): {final}")
        assert node.proc.wait(30) == 0, node.report()
    finally:
        node.close()
    assert final["opens"] == 2, final  # the first connection and exactly one reconnect
    assert final["subscriptions"] == 2 and final["follows"] == 2, final
    first_close = final["closes"][0]
    if what == "bridge":
        assert first_close["code"] == 1006, final  # the bridge vanished: no close frame
    else:
        # The bridge closes 4000 "dshd closed the connection" (its log says so, and a
        # trio-websocket client receives it). Node 20's WebSocket (undici 6) loses the last
        # message and the close frame when they arrive right behind each other (here: dshd's
        # -32014 answer to the pending tool.wait, then the close) and reports 1006; Chromium
        # gets 4000 (the page room's browser test).
        assert "WebSocket closed 4000: dshd closed the connection" in bridge.log, bridge.log
        assert first_close in ({"code": 4000, "reason": "dshd closed the connection", "retryInMs": 250},
                               {"code": 1006, "reason": "", "retryInMs": 250}), final
        assert all(c["code"] == 4001 for c in final["closes"][1:]), final
    assert final["bytes"] == len("tick 000000\n") * final["ticks"] + len(f"stopped after {final['ticks']}\n")
    assert bridge.token not in bridge.log
