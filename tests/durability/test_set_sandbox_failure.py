"""session.setSandbox when its event cannot be made durable (fsync fails, injected): -32014
and the old sandbox mode stays -- in session.get, on the lane, for the next call, after the
fault clears and after a restart (as setApprovalPolicy, ``dshd.sessions.settings``).

dshd runs in-process here so that ``os.fsync`` can be swapped under it.
"""

from __future__ import annotations

import pytest
import trio

from client.api import connect
from dshd.storage import read_log
from protocol.rpc import STORAGE_FAILURE, RpcError

from .test_fsync_failure import FsyncSwitch, _start


@pytest.mark.parametrize("taken_back", ["retracted", "compensated"])
async def test_failed_sandbox_change_changes_nothing(root, workdir, monkeypatch, taken_back):
    from dshd.storage.writer import SessionLog

    if taken_back == "compensated":  # as if another event had been appended after it
        monkeypatch.setattr(SessionLog, "retract", lambda self, first, last: False)
    switch = FsyncSwitch(monkeypatch)
    sock = root / "run" / "dshd.sock"
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            sid = await c.create_session(str(workdir), sandbox="workspace-write")
            switch.failing = True
            with pytest.raises(RpcError) as err:
                await c.set_sandbox(sid, "read-only")
            assert err.value.code == STORAGE_FAILURE
            assert (await c.get_session(sid))["sandbox"] == "workspace-write"
            async with await c.subscribe(sid) as sub:
                view = await sub.next_view()
            assert view["session"]["sandbox"] == "workspace-write"
            switch.failing = False
            # the next call still runs under the old mode: it may write the workspace
            cid = await c.run_tool(sid, "echo ok > written && cat written", approved=True)
            assert (await c.wait(sid, cid))["content"] == "ok\n"
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            assert (await c.get_session(sid))["sandbox"] == "workspace-write"
            await c.set_sandbox(sid, "read-only")  # the retry works, and confines
            assert (await c.get_session(sid))["sandbox"] == "read-only"
            cid = await c.run_tool(sid, "touch denied", approved=True)
            assert (await c.wait(sid, cid))["exitCode"] != 0
        nursery.cancel_scope.cancel()
    assert not (workdir / "denied").exists()
    modes = [(e.data["mode"], e.data["source"])
             for e in read_log(root / "state" / "sessions" / sid, sid).events
             if e.type == "sandbox/mode"]
    assert modes[-1] == ("read-only", "session.setSandbox")
    assert modes == ([("workspace-write", "session.create"), ("read-only", "session.setSandbox")]
                     if taken_back == "retracted" else
                     [("workspace-write", "session.create"), ("read-only", "session.setSandbox"),
                      ("workspace-write", "rollback"), ("read-only", "session.setSandbox")])
