"""What crash repair writes, end to end (STORAGE.md §5, §6): a call cut off by kill -9 settles
TOOL_OUTCOME_UNKNOWN with the spec's sentence (and the last checkpointed output window), and a
tool call a model announced but that never got its ``tool/call`` settles TOOL_NOT_STARTED."""

from __future__ import annotations

import json
import signal

import pytest
import trio

from client.api import connect
from crash.campaign import kill_marked
from dshd.storage import SessionLog
from protocol.rpc import RpcError

from .helpers import (NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT, all_events, assert_as_on_disk,
                      assert_paired)

#: details.truncation of a repaired call with no checkpointed window (PROTOCOL.md §3.2).
ZERO_TRUNCATION = {"truncated": False, "truncatedBy": None, "totalBytes": 0, "totalLines": 0,
                   "maxBytes": 51_200, "maxLines": 2_000}


async def _kill_while_running(daemon, workdir, token) -> tuple[str, str]:
    """Start a call that prints and then sleeps; SIGKILL dshd once the output is live and has
    been checkpointed to its sidecar; kill the orphaned tool (if any); restart."""
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        cid = await c.run_tool(sid, f"echo first-line; echo second-line; sleep 60; : {token}",
                               approved=True)
        sub = await c.subscribe(sid)
        with trio.fail_after(20):
            async for view in sub:
                tool = view["tools"].get(cid)
                if tool and "second-line" in tool["output"]["content"][0]["text"]:
                    break
        # Give the checkpoint (≤ once a second) time to catch the output: poll the sidecar,
        # bounded; without one the wait just ends.
        sidecar = daemon.state_dir / "sessions" / sid / "pending" / f"{cid}.ops.jsonl"
        with trio.move_on_after(5):
            while not (sidecar.exists() and b"second-line" in sidecar.read_bytes()):
                await trio.sleep(0.05)
    daemon.kill9()
    # The call host outlives the daemon (HOST.md §7): its death too makes the outcome unknown.
    daemon.kill_hosts()
    kill_marked(token)  # an orphaned tool, if the sandbox did not take it down with dshd
    daemon.start()
    return sid, cid


async def test_kill9_mid_call_settles_outcome_unknown(daemon, workdir, token):
    sid, cid = await _kill_while_running(daemon, workdir, token)
    async with connect(daemon.socket) as c:
        result = await c.wait(sid, cid)
        assert result["isError"] is True
        assert result["errorCode"] == "TOOL_OUTCOME_UNKNOWN"
        assert result["content"].startswith(OUTCOME_UNKNOWN_TEXT)
        events = await all_events(c, sid)
        assert_paired(events, daemon.state_dir / "sessions" / sid)
        assert events[-1]["type"] == "tool/result" and events[-1]["data"] == result
        # Never re-run: the same callId names the existing call (another command under it is
        # CALL_ID_REUSED, and runs nothing either).
        sent = next(e for e in events if e["type"] == "tool/call")["data"]["arguments"]
        again = await c.call("tool.run", {"sessionId": sid, "name": "bash", "callId": cid,
                                          "arguments": json.loads(sent), "approved": True})
        assert again["callId"] == cid and again["existing"] is True
        with pytest.raises(RpcError) as err:
            await c.call("tool.run", {"sessionId": sid, "name": "bash", "callId": cid,
                                      "arguments": {"command": "echo no"}, "approved": True})
        assert err.value.data["code"] == "CALL_ID_REUSED"
        assert await all_events(c, sid) == events
    daemon.kill9()
    daemon.start()
    async with connect(daemon.socket) as c:  # repair is not repeated on the next open
        assert await all_events(c, sid) == events


async def test_kill9_mid_call_keeps_last_checkpointed_output(daemon, workdir, token):
    sid, cid = await _kill_while_running(daemon, workdir, token)
    async with connect(daemon.socket) as c:
        result = await c.wait(sid, cid)
        assert result["errorCode"] == "TOOL_OUTCOME_UNKNOWN"
        assert result["content"].startswith(OUTCOME_UNKNOWN_TEXT)
        assert "first-line\nsecond-line\n" in result["content"]
        assert result["details"]["truncation"]["totalLines"] == 2
    # The sidecar is retired once the repaired result is durable.
    assert not (daemon.state_dir / "sessions" / sid / "pending" / f"{cid}.ops.jsonl").exists()


async def _announce(daemon, workdir) -> tuple[str, str]:
    """A session whose log ends with a model turn that named a tool call (as the agent loop
    writes it), cut off before the call's ``tool/call``."""
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
    assert daemon.stop(signal.SIGTERM) == 0
    cid = "call-from-model"
    log = await SessionLog.open_for_write(daemon.state_dir, sid)
    try:
        log.append("turn/start", {"turnId": "t1"})
        log.append("message/user", {"turnId": "t1", "text": "list the files"})
        log.append("step/start", {"turnId": "t1", "stepId": "s1"})
        log.append("message/assistant", {"turnId": "t1", "text": "", "toolCalls": [
            {"callId": cid, "name": "bash", "arguments": '{"command": "ls"}'}]})
        await log.flush()
    finally:
        await log.aclose()
    daemon.start()
    return sid, cid


async def test_announced_call_without_tool_call_settles_not_started(daemon, workdir):
    sid, cid = await _announce(daemon, workdir)
    async with connect(daemon.socket) as c:
        events = await all_events(c, sid)
    closers = [(e["type"], e["data"]) for e in events[-3:]]
    assert closers == [
        ("tool/result", {"callId": cid, "isError": True, "content": NOT_STARTED_TEXT,
                         "details": {"truncation": ZERO_TRUNCATION}, "errorCode": "TOOL_NOT_STARTED"}),
        ("step/end", {"turnId": "t1", "stepId": "s1"}),
        ("turn/end", {"turnId": "t1", "reason": "interrupted"}),
    ]
    assert_as_on_disk(events, daemon.state_dir / "sessions" / sid)
    assert not any(e["type"] == "tool/call" for e in events)


async def test_tool_wait_answers_a_not_started_call(daemon, workdir):
    sid, cid = await _announce(daemon, workdir)
    async with connect(daemon.socket) as c:
        result = await c.wait(sid, cid)
    assert result["errorCode"] == "TOOL_NOT_STARTED" and result["content"] == NOT_STARTED_TEXT
