"""``dsh rm`` / ``dsh prune`` in system mode, through the real CLI run as real users: only a
session's owner (or root) may delete it, and prune never touches another user's sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.e2e.test_e2e_system_mode import _as, system_daemon  # noqa: F401 - fixture

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dsh_as(user, d, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
           "DSH_SOCKET": str(d.socket), "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "client.cli", *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
               *cmd]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def owned(d) -> dict[str, int | None]:
    out = json.loads(dsh_as(None, d, "--json", "sessions").stdout)
    rows = out["sessions"] if isinstance(out, dict) else out
    return {s["sessionId"]: s.get("owner") for s in rows}


def test_only_the_owner_or_root_deletes(system_daemon):
    d, member, stranger, mine, secret = system_daemon
    made = _as(member, d.socket, [["session.create", {"cwd": str(mine)}],
                                  ["session.create", {"cwd": str(mine)}]])
    member_a, member_b = made[1]["result"]["sessionId"], made[2]["result"]["sessionId"]
    r = dsh_as(None, d, "run", "--", "true")  # root's own session (cwd: the repo)
    assert r.returncode == 0, r.stderr
    root_sid = r.stderr.split("session ", 1)[1].split()[0]
    # The member may not delete root's session, nor prune it. Through the CLI it cannot even
    # name it: `dsh rm` resolves with session.find, which never names another user's session
    # (PROTOCOL.md §3.1); asked directly, session.delete refuses it as another user's.
    r = dsh_as(member, d, "rm", root_sid)
    assert r.returncode == 1 and f"session {root_sid} not found" in r.stderr, r.stderr
    refused = _as(member, d.socket, [["session.delete", {"sessionId": root_sid}]])[1]
    assert refused["error"]["code"] == -32001, refused
    assert "another user" in refused["error"]["message"], refused
    r = dsh_as(member, d, "--json", "prune", "--older-than", "0s")
    assert r.returncode == 0, r.stderr
    pruned = json.loads(r.stdout)["deleted"]
    assert root_sid not in pruned and root_sid in owned(d)
    assert set(pruned) == {member_a, member_b}  # its own idle ones went
    made = _as(member, d.socket, [["session.create", {"cwd": str(mine)}],
                                  ["session.create", {"cwd": str(mine)}]])
    member_c, member_d = made[1]["result"]["sessionId"], made[2]["result"]["sessionId"]
    assert dsh_as(member, d, "rm", member_c).returncode == 0
    assert dsh_as(None, d, "rm", member_d).returncode == 0  # root may
    left = owned(d)
    assert member_c not in left and member_d not in left and root_sid in left
    audit = [json.loads(x) for x in d.log_path.read_text().splitlines()
             if '"session.deleted"' in x]
    by = {rec["session"]: rec["by"] for rec in audit}
    assert by[member_c] == member.pw_uid and by[member_d] == 0
