"""System mode through the bridge (docs/WEB.md): ``dsh web`` started as user A talks to dshd
as A, so user B's sessions never appear and B's calls are refused. Real root dshd in system
mode, real users (useradd), the bridge run as A with setpriv, a real WebSocket."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import trio

from tests.e2e.test_e2e_system_mode import CLIENT, system_daemon  # noqa: F401 - fixture
from tests.web.bridge_support import sign_in, ws_rpc
from tests.web.conftest import WebBridge

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def as_root(socket, requests: list) -> list:
    """The requests on a connection of this (root) process: user B."""
    r = subprocess.run([sys.executable, "-c", CLIENT, str(socket), json.dumps(requests)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_second_users_sessions_never_appear(system_daemon):
    d, member, stranger, mine, secret = system_daemon
    theirs = as_root(d.socket, [
        ["session.create", {"cwd": str(secret)}],
        ["tool.run", {"sessionId": "$SID", "name": "bash", "approved": True,
                      "arguments": {"command": "echo root-only-output"}}],
        ["tool.wait", {"sessionId": "$SID", "callId": "$CID"}],
        ["tool.read", {"sessionId": "$SID", "callId": "$CID", "offset": 0}],
    ])
    assert "result" in theirs[4], theirs[4]  # B itself may read it: the refusal below is A's
    b_sid, b_cid = theirs[1]["result"]["sessionId"], theirs[2]["result"]["callId"]
    home = d.root / "member-web"
    home.mkdir(mode=0o700)
    os.chown(home, member.pw_uid, member.pw_gid)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
           "PYTHONPATH": ROOT}
    bridge = WebBridge(d.socket, home / "web-token", env=env, prefix=(
        "setpriv", f"--reuid={member.pw_uid}", f"--regid={member.pw_gid}", "--init-groups"))
    try:
        bridge.start()
        assert (home / "web-token").stat().st_uid == member.pw_uid
        cookie = sign_in(bridge)

        async def as_member() -> None:
            async with ws_rpc(bridge, cookie) as rpc:
                await rpc.initialize()
                a_sid = (await rpc.result("session.create", {"cwd": str(mine)}))["sessionId"]
                ran = await rpc.result("tool.run", {
                    "sessionId": a_sid, "name": "bash", "approved": True,
                    "arguments": {"command": "id -u"}})
                done = await rpc.result("tool.wait", {"sessionId": a_sid,
                                                      "callId": ran["callId"]})
                assert done["content"].strip() == str(member.pw_uid)  # A, never root
                listed = [s["sessionId"] for s in (await rpc.result("session.list"))["sessions"]]
                assert a_sid in listed and b_sid not in listed
                read = await rpc.call("tool.read", {"sessionId": b_sid, "callId": b_cid,
                                                    "offset": 0})
                assert read["error"]["code"] == -32001, read
                got = await rpc.call("session.get", {"sessionId": b_sid})
                assert got["error"]["code"] == -32001, got
                sub = await rpc.call("subscribe", {"sessionId": b_sid})
                assert "error" in sub, sub
        trio.run(as_member)
        assert "root-only-output" not in bridge.log
    finally:
        bridge.close()
