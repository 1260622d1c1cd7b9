"""The kill sweep and the Landlock launcher's parent-death signal, against a real dshd.

* The sweep that SIGKILLs what is left of a stopped call keys on the run's own random token
  (``DSH_RUN``), never on the client-chosen ``callId``: two sessions may hold the same callId,
  and stopping one never touches the other (bwrap and Landlock).
* Under Landlock (no pid namespace), a command dies with a SIGKILLed daemon: the launcher sets
  ``PR_SET_PDEATHSIG(SIGKILL)`` before it execs the command.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

import pytest

from .conftest import live_processes_matching
from .spawn_rpc import Daemon

PROVIDERS = ["bwrap", "landlock"]


def _wait_file(path: Path, bound: float = 60.0) -> None:
    deadline = time.monotonic() + bound
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("stop", ["cancel", "timeout"])
def test_stopping_a_call_spares_another_sessions_call_with_the_same_call_id(provider, stop, workdir):
    with Daemon(f'sandbox_provider = "{provider}"\n') as d:
        rpc_b, rpc_a = d.rpc(), d.rpc()
        sid_b, sid_a = rpc_b.session(workdir), rpc_a.session(workdir)
        # Random per test: a daemon of another checkout running this test at the same time
        # (with the old, callId-keyed sweep) must not hit ours.
        cid = f"dupcall-{secrets.token_hex(6)}"
        rpc_b.result("tool.run", {
            "sessionId": sid_b, "name": "bash", "approved": True, "callId": cid,
            "arguments": {"command": f"touch {workdir}/b-up; sleep 6; echo B-finished-normally"}})
        _wait_file(workdir / "b-up")
        args = {"command": f"touch {workdir}/a-up; sleep 30"}
        if stop == "timeout":
            args["timeout"] = 1
        rpc_a.result("tool.run", {"sessionId": sid_a, "name": "bash", "approved": True,
                                  "callId": cid, "arguments": args})
        _wait_file(workdir / "a-up")
        if stop == "cancel":
            assert rpc_a.result("tool.cancel", {"sessionId": sid_a, "callId": cid})["cancelled"]
        a = rpc_a.wait(sid_a, cid)
        assert a["errorCode"] == ("TOOL_CANCELLED" if stop == "cancel" else "TOOL_TIMEOUT"), a
        b = rpc_b.wait(sid_b, cid)
        assert b["content"] == "B-finished-normally\n", b
        assert b["exitCode"] == 0 and not b["isError"], b


def test_a_landlock_command_dies_with_a_killed_daemon(workdir):
    """Under ``on_stop = "cancel"`` (a host spec with ``on_daemon_loss = "terminate"``) a
    killed daemon's command dies; the default ``"detach"`` keeps it for the next daemon to
    adopt (tests/daemon/test_restart.py, issue 13)."""
    tag = f"dsh-pdeath-{os.getpid()}-{time.monotonic_ns()}"
    with Daemon('sandbox_provider = "landlock"\non_stop = "cancel"\n') as d:
        rpc = d.rpc()
        sid = rpc.session(workdir)
        # The shell itself writes the marker: killing it (not just its sleep) prevents it.
        rpc.start(sid, f"exec sh -c 'echo ready > ready; sleep 8; echo after > marker_after' {tag}")
        _wait_file(workdir / "ready")
        assert live_processes_matching(tag), "the command's sh is not running"
        d.kill9()
        time.sleep(10)
        alive = live_processes_matching(tag)
        for pid in alive:  # do not leave it behind for the next test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert not (workdir / "marker_after").exists(), "the command outlived the daemon"
        assert alive == [], f"the command's sh outlived the daemon: {alive}"


def test_a_session_env_may_not_set_dshs_own_names(daemon, workdir):
    """A session env could set DSH_RUN and keep its own setsid children out of the kill sweep
    (or forge DSH_CALL_ID for a tool that trusts it): the names dshd sets are refused at
    create; other DSH_ names are the session's to use."""
    from .wire import Wire, events

    w = Wire(daemon.socket)
    for name in ("DSH_RUN", "DSH_CALL_ID", "DSH_SESSION_ID"):
        err = w.error("session.create", {"cwd": str(workdir), "env": {name: "x"}})
        assert err["code"] == -32602 and name in err["message"], err
    ok = w.result("session.create", {"cwd": str(workdir), "env": {"DSH_MY_TOKEN": "x"}})
    assert events(w, ok["sessionId"])  # an ordinary name is fine
