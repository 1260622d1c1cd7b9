"""A session is supervised (issue 10 item 2b), at the session level: an exception in the log
writer's task -- a bug, injected here by wrapping ``SessionLog.run`` in-process -- crashes only
that session. Its running call is killed and settles with a sentence saying so, its lock is
released, other sessions never notice, and the next request reopens it from its log.
The publisher and call-task variants run against a real dshd process in
tests/e2e/test_e2e_hardening_storage.py."""

from __future__ import annotations

import trio

from client.api import connect
from dshd.storage.writer import SessionLog

from .helpers import all_events, assert_paired
from .test_fsync_failure import _start


async def test_a_crash_in_the_writer_task_is_supervised(root, workdir, monkeypatch, token):
    armed: set[str] = set()
    real_run = SessionLog.run

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as nursery:
            await nursery.start(real_run, self)
            task_status.started()
            while self.session_id not in armed:
                await trio.sleep(0.01)
            armed.discard(self.session_id)
            raise RuntimeError("injected bug in the writer task")

    monkeypatch.setattr(SessionLog, "run", run)
    sock = root / "run" / "dshd.sock"
    async with trio.open_nursery() as nursery:
        await _start(nursery, root)
        async with connect(sock) as c:
            a = await c.create_session(str(workdir), approval_policy="never")
            b = await c.create_session(str(workdir), approval_policy="never")
            # Arm the crash once the command has really started (its marker file exists): a
            # pre-approved call is "running" in the lane from admission, before its barrier,
            # and a crash there is ABORTED_BEFORE_DISPATCH (nothing ran), not TOOL_CANCELLED.
            started = workdir / f"started-{token}"
            sleeper = await c.run_tool(a, f"touch {started}; sleep 30; : {token}")
            with trio.fail_after(30):
                while not started.exists():
                    await trio.sleep(0.02)
            armed.add(a)
            with trio.fail_after(30):
                result = await c.wait(a, sleeper)
            assert result["errorCode"] == "TOOL_CANCELLED"
            assert "the session crashed (RuntimeError: injected bug in the writer task" in \
                result["message"]
            cid = await c.run_tool(b, "echo b")
            assert (await c.wait(b, cid))["content"] == "b\n"
            # Reopened from its log: the same result, durable, and new calls work.
            assert await c.wait(a, sleeper) == result
            cid = await c.run_tool(a, "echo a")
            assert (await c.wait(a, cid))["content"] == "a\n"
            assert_paired(await all_events(c, a), root / "state" / "sessions" / a)
            assert (await c.get_session(a))["running"] == 0
        nursery.cancel_scope.cancel()
