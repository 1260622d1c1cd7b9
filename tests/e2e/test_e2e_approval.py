"""The approval matrix against a real daemon (PROTOCOL.md §3.4, issue 4): every outcome settles
with its code, the marker file appears only when a call was allowed, the audit pair shares one id."""

from __future__ import annotations

import pytest

from client.api import connect
from protocol.rpc import RpcError


def _marker_cmd(path) -> str:
    return f"echo ran >> {path}; echo done"


async def _audit(c, sid: str, call_id: str) -> tuple[dict, dict]:
    events = [e async for e in c.iter_events(sid)]
    asked = [e for e in events if e["type"] == "approval/asked" and e["data"]["callId"] == call_id]
    assert len(asked) == 1
    aid = asked[0]["data"]["approvalId"]
    decided = [e for e in events if e["type"] == "approval/decided" and e["data"]["approvalId"] == aid]
    assert len(decided) == 1 and decided[0]["seq"] > asked[0]["seq"]
    return asked[0]["data"], decided[0]["data"]


async def _pending_approval(sub, call_id: str) -> str:
    async for view in sub:
        for aid, entry in view["approvals"].items():
            if entry["callId"] == call_id:
                assert view["tools"][call_id]["state"] == "waiting-approval"
                return aid
    raise AssertionError("stream ended")


async def test_pre_approved_runs_under_ask_with_no_answerer(daemon, workdir):
    marker = workdir / "m"
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), approval_policy="ask")
        cid = await c.run_tool(sid, _marker_cmd(marker), approved=True)
        result = await c.wait(sid, cid)
        asked, decided = await _audit(c, sid, cid)
    assert result["exitCode"] == 0 and marker.read_text() == "ran\n"
    assert decided == {"approvalId": asked["approvalId"], "outcome": "allowed-once", "by": "caller"}
    assert asked["summary"] == _marker_cmd(marker)  # the exact command, not a label


@pytest.mark.parametrize("decision", ["allow", "reject"])
async def test_answerer_decides(daemon, workdir, decision):
    marker = workdir / "m"
    async with connect(daemon.socket, "answerer", approvals=True) as ans, connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        sub = await ans.subscribe(sid)
        await sub.next_view()
        long_cmd = _marker_cmd(marker) + " # " + "x" * 300
        cid = await c.run_tool(sid, long_cmd, approved=False)
        aid = await _pending_approval(sub, cid)
        assert sub.mirror.value["approvals"][aid]["summary"] == long_cmd
        r = await ans.call("approval.decide", {"sessionId": sid, "approvalId": aid, "decision": decision})
        result = await c.wait(sid, cid)
        # A second decision is refused with the outcome.
        with pytest.raises(RpcError) as exc:
            await c.call("approval.decide", {"sessionId": sid, "approvalId": aid, "decision": "allow"})
        assert exc.value.code == -32011
        asked, decided = await _audit(c, sid, cid)
    if decision == "allow":
        assert r["outcome"] == "allowed-once" and result["exitCode"] == 0
        assert marker.read_text() == "ran\n"
        assert exc.value.data == {"outcome": "allowed-once"}
    else:
        assert r["outcome"] == "rejected" and result["errorCode"] == "APPROVAL_REJECTED"
        assert result["isError"] is True and "rejected" in result["content"]
        assert not marker.exists()
    assert decided["by"] == "answerer" and decided["approvalId"] == asked["approvalId"]


async def test_policy_never_rejects_before_any_prompt(daemon, workdir):
    marker = workdir / "m"
    async with connect(daemon.socket, "answerer", approvals=True) as ans, connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir), approval_policy="never")
        sub = await ans.subscribe(sid)
        await sub.next_view()
        cid = await c.run_tool(sid, _marker_cmd(marker), approved=False)
        result = await c.wait(sid, cid)
        asked, decided = await _audit(c, sid, cid)
        view = sub.mirror.value
    assert result["errorCode"] == "APPROVAL_REJECTED" and "never" in result["content"]
    assert decided["outcome"] == "rejected" and decided["by"] == "policy"
    assert view["approvals"] == {}
    assert not marker.exists()


async def test_no_answerer_is_unavailable(daemon, workdir):
    marker = workdir / "m"
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        # A plain (non-answerer) subscriber does not count as an answerer.
        sub = await c.subscribe(sid)
        await sub.next_view()
        cid = await c.run_tool(sid, _marker_cmd(marker), approved=False)
        result = await c.wait(sid, cid)
        _, decided = await _audit(c, sid, cid)
    assert result["errorCode"] == "APPROVAL_UNAVAILABLE" and "dsh attach --approve" in result["content"]
    assert decided["outcome"] == "unavailable"
    assert not marker.exists()


async def test_last_answerer_leaving_makes_it_unavailable(daemon, workdir):
    marker = workdir / "m"
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        async with connect(daemon.socket, "answerer", approvals=True) as ans:
            sub = await ans.subscribe(sid)
            await sub.next_view()
            cid = await c.run_tool(sid, _marker_cmd(marker), approved=False)
            await _pending_approval(sub, cid)
        # The answerer's connection closed without deciding.
        result = await c.wait(sid, cid)
        _, decided = await _audit(c, sid, cid)
    assert result["errorCode"] == "APPROVAL_UNAVAILABLE"
    assert decided["outcome"] == "unavailable"
    assert not marker.exists()


async def test_cancel_while_pending(daemon, workdir):
    marker = workdir / "m"
    async with connect(daemon.socket, "answerer", approvals=True) as ans, connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        sub = await ans.subscribe(sid)
        await sub.next_view()
        cid = await c.run_tool(sid, _marker_cmd(marker), approved=False)
        await _pending_approval(sub, cid)
        assert await c.cancel(sid, cid) is True
        result = await c.wait(sid, cid)
        _, decided = await _audit(c, sid, cid)
        async for view in sub:
            if not view["approvals"]:
                break
    assert result["errorCode"] == "APPROVAL_CANCELLED"
    assert decided["outcome"] == "cancelled"
    assert not marker.exists()


async def test_second_frontend_attaching_mid_ask_sees_and_answers(daemon, workdir):
    marker = workdir / "m"
    async with connect(daemon.socket, "first", approvals=True) as first, connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        sub1 = await first.subscribe(sid)
        await sub1.next_view()
        cid = await c.run_tool(sid, _marker_cmd(marker), approved=False)
        aid = await _pending_approval(sub1, cid)
        async with connect(daemon.socket, "second", approvals=True) as second:
            sub2 = await second.subscribe(sid)
            base = await sub2.next_view()
            assert sub2.mirror.last_ops[0][0] == "r"
            assert base["approvals"][aid]["callId"] == cid
            r = await second.call("approval.decide", {"sessionId": sid, "approvalId": aid,
                                                      "decision": "allow"})
            assert r["outcome"] == "allowed-once"
            result = await c.wait(sid, cid)
    assert result["exitCode"] == 0 and marker.read_text() == "ran\n"


async def test_set_policy_and_unknown_approval(daemon, workdir):
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        await c.call("session.setApprovalPolicy", {"sessionId": sid, "policy": "never"})
        assert (await c.get_session(sid))["approvalPolicy"] == "never"
        cid = await c.run_tool(sid, "true", approved=False)
        assert (await c.wait(sid, cid))["errorCode"] == "APPROVAL_REJECTED"
        with pytest.raises(RpcError) as exc:
            await c.call("approval.decide", {"sessionId": sid, "approvalId": "a-nope", "decision": "allow"})
        assert exc.value.code == -32007
        with pytest.raises(RpcError) as exc:
            await c.call("session.setApprovalPolicy", {"sessionId": sid, "policy": "sometimes"})
        assert exc.value.code == -32602
