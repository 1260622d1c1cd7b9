"""Approvals pending across a daemon restart (issue 13 item 3; HOST.md §7), end to end: a real
``python -m dshd`` (its sandbox whatever this machine has: bwrap or Landlock), real sockets,
real clients (``client.api``), stopped by SIGTERM (``on_stop = "detach"``) or killed by
SIGKILL while a call waits for its approval, then started again.

After the start the call is asked again with the same ``approvalId`` (no second
``approval/asked``), in the lane's ``approvals`` for an answerer that attaches only then;
allowing it runs the command exactly once (a marker file gets one line), rejecting it never
runs it, nobody within ``reask_grace_seconds`` is ``APPROVAL_UNAVAILABLE``, and a session whose
policy became ``never`` while it waited rejects it at once. Every test ends the daemon and
its call hosts (``DshdProcess.close``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import msgspec
import pytest
import trio

from client.api import connect
from tests.agent.helpers import WAIT_S, DaemonProcess

COMMAND = "echo ran >> marker.txt; echo done"


@pytest.fixture
def root():
    root = Path(tempfile.mkdtemp(prefix="dsh-askq-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def workdir(root):
    w = root / "work"
    w.mkdir()
    return w


def config(grace: float = 120.0) -> str:
    return f"reask_grace_seconds = {grace}\nlog_level = \"info\"\n"


def sandbox_of(c) -> str:
    return "workspace-write" if c.server["sandbox"]["provider"] != "none" \
        else "danger-full-access"


async def approval_of(sub, call_id: str) -> tuple[str, dict]:
    """Wait (bounded) until the lane shows an approval for ``call_id``."""
    with trio.fail_after(WAIT_S):
        view = await sub.next_view()
        while True:
            for aid, entry in (view.get("approvals") or {}).items():
                if entry.get("callId") == call_id:
                    return aid, dict(entry)
            view = await sub.next_view()


async def ask_then_restart(daemon: DaemonProcess, workdir: Path, how: str, *,
                           policy_after: str | None = None) -> tuple[str, str, str]:
    """Start the daemon, ask for approval of :data:`COMMAND` with an answerer attached (so the
    request stays pending), then stop it (``term``) or kill it (``kill9``) and start it again;
    ``(sessionId, callId, approvalId)``."""
    daemon.start()
    async with connect(daemon.socket, "answerer", approvals=True) as ans, \
            connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), sandbox=sandbox_of(c))
        sub = await ans.subscribe(sid)
        cid = await c.run_tool(sid, COMMAND, approved=False)
        aid, _ = await approval_of(sub, cid)
        if policy_after is not None:
            await c.set_policy(sid, policy_after)
        if how == "kill9":
            daemon.kill9()
        else:
            daemon.stop()  # SIGTERM while the answerer is still attached
    daemon.start()
    return sid, cid, aid


async def approval_events(c, sid: str) -> list[tuple[str, dict]]:
    """The call's and the approval's events, ``(type, data)``, in log order."""
    kept = ("approval/asked", "approval/decided", "tool/call", "tool/result")
    out = []
    async for raw in c.iter_records(sid):
        e = msgspec.json.decode(raw)
        if e["type"] in kept:
            out.append((e["type"], e["data"]))
    return out


@pytest.mark.parametrize("how", ["term", "kill9"])
@pytest.mark.parametrize("decision", ["allow", "reject"])
async def test_an_approval_pending_across_a_restart_is_asked_again(root, workdir, how, decision):
    daemon = DaemonProcess(root, config())
    marker = workdir / "marker.txt"
    try:
        sid, cid, aid = await ask_then_restart(daemon, workdir, how)
        assert not marker.exists()
        async with connect(daemon.socket, "late answerer", approvals=True) as ans, \
                connect(daemon.socket) as c:
            sub = await ans.subscribe(sid)
            again, entry = await approval_of(sub, cid)
            assert again == aid and entry["summary"] == COMMAND
            assert await ans.decide(sid, aid, decision) == (
                "allowed-once" if decision == "allow" else "rejected")
            with trio.fail_after(WAIT_S):
                result = await c.wait(sid, cid)
            events = await approval_events(c, sid)
    finally:
        daemon.close()
    if decision == "allow":
        assert (result.is_error, result.exit_code, result.content) == (False, 0, "done\n")
        assert marker.read_text() == "ran\n"  # exactly once
    else:
        assert result.error_code == "APPROVAL_REJECTED" and not marker.exists()
    outcome = "allowed-once" if decision == "allow" else "rejected"
    assert [t for t, _ in events] == ["tool/call", "approval/asked", "approval/decided",
                                      "tool/result"]
    assert events[1][1]["approvalId"] == aid
    assert events[2][1] == {"approvalId": aid, "outcome": outcome, "by": "answerer"}


async def test_nobody_within_the_grace_is_unavailable(root, workdir):
    daemon = DaemonProcess(root, config(grace=1.0))
    try:
        sid, cid, aid = await ask_then_restart(daemon, workdir, "kill9")
        async with connect(daemon.socket) as c:
            with trio.fail_after(WAIT_S):
                result = await c.wait(sid, cid)
            events = await approval_events(c, sid)
    finally:
        daemon.close()
    assert result.error_code == "APPROVAL_UNAVAILABLE"
    assert "reask_grace_seconds" in result.content
    assert events[2][1] == {"approvalId": aid, "outcome": "unavailable", "by": "policy"}
    assert not (workdir / "marker.txt").exists()


async def test_a_policy_never_rejects_the_reask_at_once(root, workdir):
    """The policy became ``never`` while the call waited (it applies to the next ask): after
    the restart the re-ask is that next ask, rejected by policy without waiting."""
    daemon = DaemonProcess(root, config())
    try:
        sid, cid, aid = await ask_then_restart(daemon, workdir, "term", policy_after="never")
        async with connect(daemon.socket) as c:
            with trio.fail_after(WAIT_S):
                result = await c.wait(sid, cid)
            events = await approval_events(c, sid)
    finally:
        daemon.close()
    assert result.error_code == "APPROVAL_REJECTED"
    assert events[2][1] == {"approvalId": aid, "outcome": "rejected", "by": "policy"}
    assert not (workdir / "marker.txt").exists()


async def test_a_reasked_approval_survives_a_second_restart(root, workdir):
    """Re-asked and still in its grace when dshd stops again (SIGTERM) and then is killed
    while it waits once more: still one ``approval/asked``, still undecided, asked a third time
    after the last start; allowed, it runs once."""
    daemon = DaemonProcess(root, config())
    marker = workdir / "marker.txt"
    try:
        sid, cid, aid = await ask_then_restart(daemon, workdir, "term")
        async with connect(daemon.socket, "answerer", approvals=True) as ans:
            sub = await ans.subscribe(sid)
            assert (await approval_of(sub, cid))[0] == aid
            daemon.stop()  # an answerer attached, nobody decided
        daemon.start()
        daemon.kill9()
        daemon.start()
        async with connect(daemon.socket, "late answerer", approvals=True) as ans, \
                connect(daemon.socket) as c:
            sub = await ans.subscribe(sid)
            assert (await approval_of(sub, cid))[0] == aid
            assert await ans.decide(sid, aid, "allow") == "allowed-once"
            with trio.fail_after(WAIT_S):
                result = await c.wait(sid, cid)
            events = await approval_events(c, sid)
    finally:
        daemon.close()
    assert result.exit_code == 0 and marker.read_text() == "ran\n"
    assert [t for t, _ in events] == ["tool/call", "approval/asked", "approval/decided",
                                      "tool/result"]
