"""A state directory moved or replaced under a running dshd (STORAGE.md §4), with real daemons.

``mv state state.old; mkdir state`` leaves the first daemon's flock on the old inode, so a
second daemon can start on ``state``. The first must then not create or open sessions through
the path (that would be the second daemon's directory): session.create and opening a session
fail closed with STORAGE_FAILURE naming the path, and the daemon logs it once. And a second
daemon refused after ``rm dshd.lock`` names the lock that holds (the directory), not a file
that no longer exists."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from client.api import connect
from dshd.testing import DshdProcess
from protocol.rpc import STORAGE_FAILURE, RpcError


def _events(path, name: str) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == name:
            out.append(entry)
    return out


async def test_a_moved_state_directory_stops_session_create_and_open(daemon, workdir):
    state = daemon.state_dir
    async with connect(daemon.socket) as c:
        first = await c.create_session(str(workdir), approval_policy="never")
        one = await c.run_tool(first, "echo one")
        assert (await c.wait(first, one))["content"] == "one\n"

        os.rename(state, state.with_name("state.old"))
        os.mkdir(state, 0o700)
        second = DshdProcess(daemon.root, state_dir=state, socket_path=daemon.root / "r2" / "d.sock")
        second.log_path = daemon.root / "second.log"
        second.start()
        try:
            async with connect(second.socket) as c2:
                theirs = await c2.create_session(str(workdir), title="second's")

            for _ in range(2):
                with pytest.raises(RpcError) as err:
                    await c.create_session(str(workdir), title="must not land in state")
                assert err.value.code == STORAGE_FAILURE
                assert str(state) in err.value.message
                assert "moved or replaced under a running dshd" in err.value.message
            with pytest.raises(RpcError) as err:
                await c.events(theirs)  # a session of the second daemon's directory
            assert err.value.code == STORAGE_FAILURE
            assert "moved or replaced" in err.value.message
            assert sorted(os.listdir(state / "sessions")) == [theirs]
            assert second.proc.poll() is None
        finally:
            second.close()
    moved = _events(daemon.log_path, "storage.state_dir_moved")
    assert len(moved) == 1 and str(state) in moved[0]["reason"], moved
    assert daemon.proc.poll() is None


def test_refused_after_rm_dshd_lock_names_the_directory_lock(daemon):
    state = daemon.state_dir
    os.unlink(state / "dshd.lock")
    other = DshdProcess(daemon.root, state_dir=state, socket_path=daemon.root / "r2" / "d.sock")
    other.log_path = daemon.root / "second.log"
    proc = other.spawn()
    try:
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc != 0
    message = other.log_path.read_text()
    assert f"the state directory {state} is locked by process {daemon.pid}" in message, message
    assert "dshd.lock is locked" not in message  # the file is gone: it locks nothing
    assert "only one dshd" in message
