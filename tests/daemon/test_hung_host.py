"""``tool.cancel`` of a call whose call host stopped answering settles (HOST.md §4): a real
``python -m dshd``, a real host SIGSTOPped; the daemon SIGKILLs the host and its command once
no exit record came within the kill grace and a bound, and frees the call's slot."""

from __future__ import annotations

import json
import os
import signal
import time

from dshd.callhost import tree
from e2e.spawn_rpc import Daemon

#: Liveness bound (seconds): kill grace + the escalation bound (10 s) + a generous margin.
LIVENESS = 60.0


def _alive(pid: int, start_time: int) -> bool:
    st = tree.proc_stat(pid)
    return st is not None and st.start_time == start_time


def test_a_cancel_of_a_stopped_host_settles_cancelled_and_frees_the_slot(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    marks = work / "marks"
    root = tmp_path / "d"
    root.mkdir()
    host = None
    with Daemon("kill_grace_seconds = 1\nmax_calls_per_session = 1\n", root=root) as d:
        try:
            rpc = d.rpc()
            sid = rpc.session(work)
            cid = rpc.start(sid, f"while :; do echo x >> {marks}; sleep 0.1; done")
            call_dir = d.state_dir / "sessions" / sid / "calls" / cid
            deadline = time.monotonic() + LIVENESS
            while not (marks.exists() and (call_dir / "host.json").exists()):
                assert time.monotonic() < deadline, "the loop did not start"
                time.sleep(0.05)
            host = json.loads((call_dir / "host.json").read_text())
            os.kill(host["pid"], signal.SIGSTOP)
            assert rpc.result("tool.cancel", {"sessionId": sid, "callId": cid}) == {
                "cancelled": True}
            result = rpc.wait(sid, cid, timeout=LIVENESS)
            assert result["errorCode"] == "TOOL_CANCELLED", result
            assert "did not answer" in result["message"] and "killed" in result["message"], result
            assert not _alive(host["pid"], host["startTime"])
            size = marks.stat().st_size
            time.sleep(0.5)
            assert marks.stat().st_size == size, "the command still writes"
            # The slot is free: the one call a session may run is accepted and runs.
            assert rpc.run(sid, "echo again")["content"] == "again\n"
        finally:
            if host is not None and _alive(host["pid"], host["startTime"]):
                os.kill(host["pid"], signal.SIGCONT)
