"""The lane's last word on a call equals its result (EXEC.md §2: "the final state is always
published before the call leaves the lane"), and tool.wait polls with timeout 0.

Found by a client written from docs/ alone: for a fast call the remaining output and the
call's removal were folded into one batch whose only op for the call was the delete, so a
mirror never saw the final window. Real daemon, raw socket, the pure mirror."""

from __future__ import annotations

from .wire import Lane, Wire

SCRIPT = "for i in $(seq 1 200); do echo line $i; done"


def _last_seen_output(lane: Lane, cid: str) -> dict:
    """Follow the mirror until ``cid`` is in recent; return its last output in ``tools``."""
    last = None
    while True:
        view = lane.next()
        entry = view["tools"].get(cid)
        if entry is not None:
            last = entry["output"]
        if any(r["callId"] == cid for r in view["recent"]):
            assert last is not None, "the call never appeared in tools"
            return last


def test_a_fast_calls_final_window_reaches_the_mirror(daemon, workdir):
    w = Wire(daemon.socket)
    sid = w.result("session.create", {"cwd": str(workdir)})["sessionId"]
    lane = Lane(w, sid)
    lane.next()  # base batch
    for n in range(10):
        cid = f"fast{n}"
        w.result("tool.run", {"sessionId": sid, "name": "bash", "callId": cid, "approved": True,
                              "arguments": {"command": SCRIPT}})
        output = _last_seen_output(lane, cid)
        result = w.result("tool.wait", {"sessionId": sid, "callId": cid, "timeout": 30})
        assert result["exitCode"] == 0, result
        assert output["content"][0]["text"] == result["content"], (n, output["truncation"])
        assert output["truncation"] == result["details"]["truncation"], n


def test_tool_wait_with_timeout_0_polls(daemon, workdir):
    w = Wire(daemon.socket)
    sid = w.result("session.create", {"cwd": str(workdir)})["sessionId"]
    w.result("tool.run", {"sessionId": sid, "name": "bash", "callId": "slow", "approved": True,
                          "arguments": {"command": "sleep 30"}})
    early = w.error("tool.wait", {"sessionId": sid, "callId": "slow", "timeout": 0})
    assert early["code"] == -32010, early
    w.result("tool.cancel", {"sessionId": sid, "callId": "slow"})
    w.result("tool.run", {"sessionId": sid, "name": "bash", "callId": "done", "approved": True,
                          "arguments": {"command": "echo hi"}})
    first = w.result("tool.wait", {"sessionId": sid, "callId": "done", "timeout": 30})
    for timeout in (0, 1e-9):
        again = w.result("tool.wait", {"sessionId": sid, "callId": "done", "timeout": timeout})
        assert again == first
