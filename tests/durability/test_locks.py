"""One dshd per state directory, one writer per session log, across processes (STORAGE.md §4)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio

from client.api import connect
from dshd.testing import DshdProcess
from protocol.rpc import SESSION_LOCKED, RpcError

from .helpers import all_events

# Holds an exclusive flock on argv[1] (writing its pid, as a dshd does) until stdin closes.
HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("busy", flush=True)
    sys.exit(3)
os.ftruncate(fd, 0)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("locked", flush=True)
sys.stdin.read()
"""


class Holder:
    def __init__(self, path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    async def first_line(self) -> bytes:
        return await trio.to_thread.run_sync(self.proc.stdout.readline)

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()


def test_second_daemon_on_same_state_dir_exits_naming_the_holder(daemon, root):
    other = DshdProcess(root, state_dir=daemon.state_dir, socket_path=root / "run2" / "d.sock")
    other.log_path = root / "second.log"
    proc = other.spawn()
    try:
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc != 0
    message = other.log_path.read_text()
    assert f"process {daemon.pid}" in message and "dshd.lock" in message
    assert not (root / "run2" / "d.sock").exists()
    # The first daemon is unaffected.
    with pytest.raises(subprocess.TimeoutExpired):
        daemon.proc.wait(0.1)


async def test_session_locked_by_another_process(daemon, workdir):
    async with connect(daemon.socket) as c:
        locked = await c.create_session(str(workdir), title="locked")
        free = await c.create_session(str(workdir), title="free")
        cid = await c.run_tool(locked, "echo before", approved=True)
        await c.wait(locked, cid)
        before = await all_events(c, locked)
        # While dshd holds the session, nobody else can take its lock.
        busy = Holder(daemon.state_dir / "sessions" / locked / "session.lock")
        assert await busy.first_line() == b"busy\n"
        busy.release()
        assert busy.proc.returncode == 3
    assert daemon.stop(signal.SIGTERM) == 0

    holder = Holder(daemon.state_dir / "sessions" / locked / "session.lock")
    try:
        assert await holder.first_line() == b"locked\n"
        daemon.start()
        async with connect(daemon.socket) as c:
            for method, params in [
                ("session.get", {"sessionId": locked}),
                ("session.events", {"sessionId": locked}),
                ("tool.run", {"sessionId": locked, "name": "bash",
                              "arguments": {"command": "echo no"}, "approved": True}),
                ("subscribe", {"sessionId": locked}),
            ]:
                with pytest.raises(RpcError) as err:
                    await c.call(method, params)
                assert err.value.code == SESSION_LOCKED
                assert str(holder.proc.pid) in err.value.message
            # Another session works meanwhile, and the list still shows both.
            cid = await c.run_tool(free, "echo free", approved=True)
            assert (await c.wait(free, cid))["content"] == "free\n"
            assert {i["sessionId"] for i in await c.list_sessions()} == {locked, free}
            holder.release()
            # Released: the next request opens it.
            assert await all_events(c, locked) == before
            cid = await c.run_tool(locked, "echo after", approved=True)
            assert (await c.wait(locked, cid))["content"] == "after\n"
    finally:
        holder.release()
