"""One daemon per state dir, one writer per session, across processes (STORAGE.md §4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from dshd.storage import DaemonLock, LockHeld, SessionLog, StorageWriteError
from dshd.storage.lock import lock_file, unlock_file
from storage_helpers import make_header, turn_events, write_log

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import sys
sys.path.insert(0, sys.argv[1])
from dshd.storage.lock import DaemonLock, lock_file
if sys.argv[2] == "daemon":
    DaemonLock(sys.argv[3]).acquire()
else:
    lock_file(sys.argv[3])
print("locked", flush=True)
sys.stdin.read()
"""


class Holder:
    """A separate python process that holds a lock until its stdin closes."""

    def __init__(self, kind: str, target: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(ROOT), kind, str(target)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    async def __aenter__(self) -> subprocess.Popen:
        line = await trio.to_thread.run_sync(self.proc.stdout.readline)
        assert line == b"locked\n"
        return self.proc

    async def __aexit__(self, *exc: object) -> None:
        self.proc.stdin.close()
        await trio.to_thread.run_sync(self.proc.wait)
        self.proc.stdout.close()


async def test_session_lock_held_by_another_process(state_dir):
    path = await write_log(state_dir, [turn_events(1)])
    async with Holder("session", path.parent / "session.lock") as proc:
        with pytest.raises(LockHeld) as info:
            await SessionLog.open_for_write(state_dir, "s1")
        assert info.value.holder == proc.pid
        assert info.value.path == path.parent / "session.lock"
        assert f"process {proc.pid}" in str(info.value)
        claims: set[str] = set()
        with pytest.raises(LockHeld):
            await SessionLog.open_for_write(state_dir, "s1", claims=claims)
        assert claims == set()  # a refused open leaves no claim behind
    log = await SessionLog.open_for_write(state_dir, "s1")  # released with the process
    assert log.last_seq == 0
    await log.aclose()
    assert (path.parent / "session.lock").exists()  # never unlinked


async def test_publish_refused_while_another_process_holds_the_session(state_dir):
    session_dir = state_dir / "sessions" / "s1"
    session_dir.mkdir(parents=True)
    async with Holder("session", session_dir / "session.lock") as proc:
        log = SessionLog.create(state_dir, "s1", make_header())
        log.append("turn/start", {"turnId": "t0"})
        with pytest.raises(StorageWriteError) as info:
            await log.flush()
        assert isinstance(info.value.__cause__, LockHeld)
        assert info.value.__cause__.holder == proc.pid
        assert not log.path.exists() and log.statistics()["buffered"] == 1
    assert await log.flush() == 0  # the retry after the holder left publishes the batch
    await log.aclose()


async def test_daemon_lock_twice_names_the_holder(state_dir):
    first = DaemonLock(state_dir)
    first.acquire()
    assert first.held
    assert (state_dir / "dshd.lock").read_text().strip() == str(os.getpid())
    with pytest.raises(LockHeld) as info:
        DaemonLock(state_dir).acquire()
    assert info.value.holder == os.getpid()
    assert str(os.getpid()) in str(info.value)
    first.release()
    first.release()  # idempotent
    with DaemonLock(state_dir) as again:
        assert again.held


async def test_daemon_lock_in_another_process(state_dir):
    state_dir.mkdir(mode=0o700)
    async with Holder("daemon", state_dir) as proc:
        with pytest.raises(LockHeld) as info:
            DaemonLock(state_dir).acquire()
        assert info.value.holder == proc.pid
        assert f"process {proc.pid}" in str(info.value)
    DaemonLock(state_dir).acquire()


def test_lock_follows_a_replaced_file(tmp_path):
    path = tmp_path / "x.lock"
    fd = lock_file(path)
    # Someone replaces the lock file: a newcomer locks the new inode, not the old one.
    os.rename(path, tmp_path / "old.lock")
    fd2 = lock_file(path)
    assert os.fstat(fd).st_ino != os.fstat(fd2).st_ino
    unlock_file(fd)
    unlock_file(fd2)
