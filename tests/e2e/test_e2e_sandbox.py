"""Sandbox through the daemon (EXEC.md §3, issue 4): modes, masking, fail closed, and approval
and sandbox together — an allowed call still runs confined."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from client.api import connect

from .conftest import DaemonProcess


@pytest.fixture
def outside():
    d = Path(tempfile.mkdtemp(prefix="dsh-outside-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _daemon_with(config_text: str):
    root = Path(tempfile.mkdtemp(prefix="dsh-sbx-"))
    cfg = root / "dshd.toml"
    cfg.write_text(config_text)
    d = DaemonProcess(root, ["--config", str(cfg)])
    d.start()
    return d, root


async def test_initialize_reports_the_probed_provider(daemon):
    async with connect(daemon.socket) as c:
        assert c.server["sandbox"] == {"provider": "bwrap", "completeness": "full"}
        status = await c.status()
        assert status["sandbox"]["provider"] == "bwrap" and status["sandbox"]["reason"]


async def test_workspace_write_confines_and_masks_the_state_dir(daemon, workdir, outside):
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))  # default mode: workspace-write
        other = await c.create_session(str(workdir), title="another session")
        probe = await c.run_tool(other, "echo secret-output", approved=True)
        await c.wait(other, probe)
        cmd = (
            f"echo inside > {workdir}/in.txt; "
            f"(echo x > {outside}/out.txt) 2>/dev/null || echo outside-denied; "
            f"ls -A {daemon.state_dir} | wc -l; "
            f"cat {daemon.state_dir}/sessions/*/spill/* 2>/dev/null; "
            "echo tmp-ok > /tmp/private && cat /tmp/private"
        )
        cid = await c.run_tool(sid, cmd, approved=True)
        result = await c.wait(sid, cid)
    assert result["exitCode"] == 0, result
    assert (workdir / "in.txt").read_text() == "inside\n"
    assert not (outside / "out.txt").exists()
    lines = result["content"].splitlines()
    assert lines == ["outside-denied", "0", "tmp-ok"]  # the state dir shows up empty
    assert not Path("/tmp/private").exists()
    assert "sandbox" not in result["details"]  # full confinement: nothing to warn about


async def test_read_only_mode_denies_the_workspace_too(daemon, workdir):
    async with connect(daemon.socket) as c:
        (workdir / "seen").write_text("readable\n")
        sid = await c.create_session(str(workdir), sandbox="read-only")
        cid = await c.run_tool(sid, f"cat {workdir}/seen; echo x > {workdir}/new", approved=True)
        result = await c.wait(sid, cid)
    assert result["exitCode"] != 0
    assert result["content"].startswith("readable\n")
    assert not (workdir / "new").exists()


async def test_danger_full_access_is_unconfined_and_says_so(daemon, workdir, outside):
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), sandbox="danger-full-access")
        cid = await c.run_tool(sid, f"echo x > {outside}/out.txt", approved=True)
        result = await c.wait(sid, cid)
        events = [e async for e in c.iter_events(sid)]
    assert result["exitCode"] == 0 and (outside / "out.txt").exists()
    assert result["details"]["sandbox"] == {"provider": "bwrap", "completeness": "none"}
    modes = [e["data"]["mode"] for e in events if e["type"] == "sandbox/mode"]
    assert modes == ["danger-full-access"]


async def test_forced_none_provider_fails_closed(workdir, outside):
    d, root = _daemon_with('sandbox_provider = "none"\n')
    try:
        async with connect(d.socket) as c:
            assert c.server["sandbox"]["provider"] == "none"
            sid = await c.create_session(str(workdir))
            marker = outside / "ran"
            cid = await c.run_tool(sid, f"touch {marker}", approved=True)
            result = await c.wait(sid, cid)
            assert result["errorCode"] == "SANDBOX_UNAVAILABLE" and result["isError"]
            assert "danger-full-access" in result["content"] or "sandbox" in result["content"]
            assert not marker.exists()  # nothing was spawned
            free = await c.create_session(str(workdir), sandbox="danger-full-access")
            cid = await c.run_tool(free, f"touch {marker}", approved=True)
            assert (await c.wait(free, cid))["exitCode"] == 0 and marker.exists()
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)


async def test_forced_landlock_is_partial_and_still_confines(workdir, outside):
    d, root = _daemon_with('sandbox_provider = "landlock"\n')
    try:
        async with connect(d.socket) as c:
            assert c.server["sandbox"] == {"provider": "landlock", "completeness": "partial"}
            sid = await c.create_session(str(workdir))
            cid = await c.run_tool(
                sid, f"echo in > {workdir}/in; echo out > {outside}/out", approved=True
            )
            result = await c.wait(sid, cid)
        assert result["exitCode"] != 0
        assert (workdir / "in").exists() and not (outside / "out").exists()
        assert result["details"]["sandbox"] == {"provider": "landlock", "completeness": "partial"}
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)


async def test_an_approved_call_still_runs_confined(daemon, workdir, outside):
    async with connect(daemon.socket, "answerer", approvals=True) as ans, connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        sub = await ans.subscribe(sid)
        await sub.next_view()
        cid = await c.run_tool(sid, f"echo x > {outside}/out.txt", approved=False)
        async for view in sub:
            pending = [a for a, e in view["approvals"].items() if e["callId"] == cid]
            if pending:
                break
        await ans.call("approval.decide", {"sessionId": sid, "approvalId": pending[0],
                                           "decision": "allow"})
        result = await c.wait(sid, cid)
    assert result["exitCode"] != 0
    assert not (outside / "out.txt").exists()


async def test_a_session_inside_the_state_dir_is_refused(daemon):
    from protocol.rpc import RpcError

    async with connect(daemon.socket) as c:
        await c.create_session(str(daemon.root))  # an ancestor is fine: the mask still applies
        for inside in (daemon.state_dir, daemon.state_dir / "sessions"):
            with pytest.raises(RpcError) as exc:
                await c.create_session(str(inside))
            assert exc.value.code == -32602 and "state directory" in exc.value.message
