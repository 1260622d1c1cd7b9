"""A call id whose ``tool/call`` never became durable may be sent again after a restart (the
crash campaign's "never durable (ran now)" retry): its call directory, made at admission and
marked ``settled`` by the next open (HOST.md §7), must not refuse the retry.

Found by ``make crash-test`` (issue 13): the retry settled ``ABORTED_BEFORE_DISPATCH`` ("dshd
could not start this call (OSError: [Errno 39] Directory not empty ...)") and ``tool.run``
answered ``-32603``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from client.api import connect
from dshd.testing import DshdProcess


async def test_a_call_id_that_never_became_durable_runs_when_sent_again(tmp_path):
    root = Path(tempfile.mkdtemp(prefix="dshrt-"))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    daemon = DshdProcess(root)
    try:
        daemon.start()
        async with connect(daemon.socket, "retry-test") as c:
            sid = (await c.call("session.create", {"cwd": str(workspace)}))["sessionId"]
        daemon.kill9()
        # What an admission left when the daemon died before its tool/call was flushed, after
        # the next open marked it settled (it has no tool/call, so nothing is unsettled).
        call_dir = daemon.state_dir / "sessions" / sid / "calls" / "again"
        call_dir.mkdir(parents=True, mode=0o700)
        (call_dir / "settled").touch()
        daemon.start()
        async with connect(daemon.socket, "retry-test") as c:
            answer = await c.call("tool.run", {"sessionId": sid, "name": "bash",
                                               "callId": "again", "approved": True,
                                               "arguments": {"command": "echo ran"}})
            assert answer["callId"] == "again" and not answer.get("existing"), answer
            result = await c.call("tool.wait", {"sessionId": sid, "callId": "again"})
        assert result.get("exitCode") == 0 and not result.get("errorCode"), result
        assert "ran" in result["content"]
    finally:
        daemon.close()
        shutil.rmtree(root, ignore_errors=True)
