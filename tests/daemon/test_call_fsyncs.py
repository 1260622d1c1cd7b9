"""How many fsyncs of the session log a tool call costs (STORAGE.md §4, EXEC.md §1: the
checkpoint barrier), and what the log holds when its command runs.

A pre-approved call is 4 events (``tool/call``, ``approval/asked``, ``approval/decided``,
``tool/result``) and 2 fsyncs of the log: the barrier's covers the call and its approval pair,
the result's comes before ``tool.wait`` answers. An asked call pays one more: its
``approval/asked`` is durable before the request is shown (so it can be asked again after a
restart), and the decision is durable before the command runs (else a restart would ask, and
run, again). These counts are the floor the barrier rules allow: a third fsync per
pre-approved call fails here. The command also copies the log file the moment it runs: the
copy holds the call's intent and its decision (``LogFile.append`` is pwrite + fsync). That
alone does not prove the barrier (the session's timed write may have put them there first);
test_calls.py's ``test_cancel_during_the_barrier`` and
``test_a_failed_barrier_never_runs_the_command`` do: both fail when the barrier is skipped.
"""

from __future__ import annotations

import os
import threading

from dshd.storage.reader import parse_log, session_dir_for

LOG_NAME = "session.v1.jsonl.zst"


class LogFsyncs:
    """Counts the fsyncs of one session's log file (by the fd's path), through ``os.fsync``."""

    def __init__(self, monkeypatch, session_id: str) -> None:
        self.session_id = session_id
        self.count = 0
        self._lock = threading.Lock()
        real = os.fsync

        def fsync(fd: int) -> None:
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if f"/{session_id}/" in path and LOG_NAME in path:
                with self._lock:
                    self.count += 1
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)


def events_in(copy, session_id: str) -> list:
    return parse_log(copy.read_bytes(), session_id=session_id, path=copy,
                     compression="zstd").events


async def test_a_pre_approved_call_costs_two_log_fsyncs_and_its_intent_is_on_disk_first(
        daemon, daemon_clock, nursery, monkeypatch):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    log_path = session_dir_for(daemon.state_dir, sid) / LOG_NAME
    copy = daemon.workdir / "log-at-exec"
    fsyncs = LogFsyncs(monkeypatch, sid)
    call_id = await wire.run(sid, f"cp {log_path} {copy}")
    result = await wire.wait(sid, call_id)
    assert result["exitCode"] == 0, result
    assert fsyncs.count == 2
    seen = {(ev.type, ev.data.get("callId")) for ev in events_in(copy, sid)}
    assert {("tool/call", call_id), ("approval/asked", call_id)} <= seen
    decided = [ev for ev in events_in(copy, sid) if ev.type == "approval/decided"]
    assert decided and decided[-1].data["outcome"] == "allowed-once"
    assert ("tool/result", call_id) not in seen  # the copy was made before it settled


async def test_an_asked_call_costs_three_log_fsyncs_and_its_decision_is_on_disk_first(
        daemon, daemon_clock, nursery, monkeypatch):
    answerer = await daemon.connect(approvals=True, nursery=nursery)
    sid = await daemon.create_session(answerer, approvalPolicy="ask")
    lane = await answerer.subscribe(sid)
    log_path = session_dir_for(daemon.state_dir, sid) / LOG_NAME
    copy = daemon.workdir / "log-at-exec"
    fsyncs = LogFsyncs(monkeypatch, sid)
    call_id = await answerer.run(sid, f"cp {log_path} {copy}", approved=False)
    approval_id, _ = await answerer.wait_lane(
        lane, lambda l: l.approval_for(call_id), "the approval request")
    assert fsyncs.count == 1  # tool/call + approval/asked, durable before the ask is shown
    await answerer.call("approval.decide", {"sessionId": sid, "approvalId": approval_id,
                                            "decision": "allow"})
    result = await answerer.wait(sid, call_id)
    assert result["exitCode"] == 0, result
    assert fsyncs.count == 3
    decided = [ev for ev in events_in(copy, sid) if ev.type == "approval/decided"]
    assert decided and decided[-1].data["approvalId"] == approval_id
