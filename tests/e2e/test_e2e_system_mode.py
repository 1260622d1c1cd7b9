"""System mode: group members may use dshd, and it never makes them root (issue 4 follow-up).

A root daemon serves the configured group; each session belongs to the uid that created it,
only that uid (or root) may use it, and its tools run as that uid, in a directory that uid can
enter. Real users (useradd), real setpriv, real socket permissions."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from client.api import connect

from .conftest import DaemonProcess

GROUP = "dshtestgrp"


def _ensure_user(name: str, groups: list[str]) -> pwd.struct_passwd:
    try:
        pwd.getpwnam(name)
    except KeyError:
        cmd = ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
        if groups:
            cmd[1:1] = ["-G", ",".join(groups)]
        # Another pytest-xdist worker may create the same user at the same moment: exit 9
        # ("already exists") is success; getpwnam below fails for anything else.
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode not in (0, 9):
            raise RuntimeError(f"useradd {name}: {done.stderr.strip()}")
    return pwd.getpwnam(name)


@pytest.fixture
def system_daemon():
    if os.getuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv")
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", "-f", GROUP], check=True)  # -f: a racing worker's is fine
    member = _ensure_user("dshmember", [GROUP])
    stranger = _ensure_user("dshstranger", [])
    root = Path(tempfile.mkdtemp(prefix="dsh-sys-"))
    os.chmod(root, 0o711)
    cfg = root / "dshd.toml"
    cfg.write_text(f'system = true\ngroup = "{GROUP}"\n'
                   f'socket = "{root}/run/dshd.sock"\nstate_dir = "{root}/state"\n')
    d = DaemonProcess(root, ["--config", str(cfg)])
    d.socket = root / "run" / "dshd.sock"
    d.env.pop("DSH_SOCKET", None)
    d.env.pop("DSH_STATE_DIR", None)
    d.state_dir = root / "state"
    d.start()
    mine = root / "member-work"
    mine.mkdir()
    os.chown(mine, member.pw_uid, member.pw_gid)
    secret = root / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "secret").write_text("root's\n")
    try:
        yield d, member, stranger, mine, secret
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)


CLIENT = r'''
import json, socket, sys
path, requests = sys.argv[1], json.loads(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path)
except OSError as exc:
    print(json.dumps({"connect": exc.strerror})); sys.exit(0)
f = s.makefile("rb")
def call(i, method, params):
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\n")
    while True:
        msg = json.loads(f.readline())
        if msg.get("id") == i:
            return msg
out = [call(0, "initialize", {"protocolVersion": 1})]
ctx = {}
for i, (method, params) in enumerate(requests, 1):
    params = json.loads(json.dumps(params).replace("$SID", ctx.get("sid", "")).replace("$CID", ctx.get("cid", "")))
    r = call(i, method, params)
    out.append(r)
    res = r.get("result") or {}
    if "sessionId" in res and method == "session.create": ctx["sid"] = res["sessionId"]
    if "callId" in res: ctx["cid"] = res["callId"]
print(json.dumps(out))
'''


def _as(user: pwd.struct_passwd, socket_path: Path, requests: list) -> list | dict:
    r = subprocess.run(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
         sys.executable, "-c", CLIENT, str(socket_path), json.dumps(requests)],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


async def test_a_group_member_runs_as_itself_never_as_root(system_daemon):
    d, member, stranger, mine, secret = system_daemon
    out = _as(member, d.socket, [
        ["session.create", {"cwd": str(mine)}],
        ["tool.run", {"sessionId": "$SID", "name": "bash", "approved": True,
                      "arguments": {"command": f"id -u; cat {secret}/secret || echo denied; "
                                               "echo made > here; echo HOME=$HOME"}}],
        ["tool.wait", {"sessionId": "$SID", "callId": "$CID"}],
        ["session.create", {"cwd": str(secret)}],
    ])
    result = out[3]["result"]
    lines = result["content"].splitlines()
    assert lines[0] == str(member.pw_uid)
    assert "denied" in lines and "root's" not in result["content"]
    assert (mine / "here").stat().st_uid == member.pw_uid
    assert out[4]["error"]["code"] == -32001  # a directory it cannot enter itself


async def test_sessions_belong_to_their_owner(system_daemon):
    d, member, stranger, mine, secret = system_daemon
    async with connect(d.socket) as c:  # root's own session
        sid = await c.create_session(str(mine))
    out = _as(member, d.socket, [
        ["session.get", {"sessionId": sid}],
        ["tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                      "arguments": {"command": "id"}}],
        ["session.list", {}],
    ])
    assert out[1]["error"]["code"] == -32001
    assert out[2]["error"]["code"] == -32001
    assert sid not in [s["sessionId"] for s in out[3]["result"]["sessions"]]


def test_a_stranger_cannot_even_connect(system_daemon):
    d, member, stranger, mine, secret = system_daemon
    st = os.stat(d.socket)
    assert oct(st.st_mode & 0o777) == "0o660" and st.st_gid == grp.getgrnam(GROUP).gr_gid
    assert os.stat(d.socket.parent).st_gid == grp.getgrnam(GROUP).gr_gid
    out = _as(stranger, d.socket, [])
    assert out == {"connect": "Permission denied"}


async def test_a_directory_swapped_for_a_symlink_is_entered_as_the_owner(system_daemon):
    d, member, stranger, mine, secret = system_daemon
    out = _as(member, d.socket, [
        ["session.create", {"cwd": str(mine), "sandbox": "danger-full-access"}],
    ])
    sid = out[1]["result"]["sessionId"]
    # After the check at session.create, the directory becomes a link to root's 0700 dir.
    shutil.rmtree(mine)
    mine.symlink_to(secret)
    out = _as(member, d.socket, [
        ["tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                      "arguments": {"command": "pwd; cat secret"}}],
        ["tool.wait", {"sessionId": sid, "callId": "$CID"}],
    ])
    result = out[2]["result"]
    assert result["isError"] and "root's" not in result["content"]
    assert str(secret) not in result["content"]  # it never got in
