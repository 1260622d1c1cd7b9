"""Failed durable writes (STORAGE.md §4, §6): a log whose first write failed can be given up
without ever appearing, and a directory entry whose fsync failed is fsynced again."""

from __future__ import annotations

import errno
import os

import pytest

from dshd.storage import PendingOutput, SessionLog, StorageError, StorageWriteError, read_log
from storage_helpers import make_header


async def test_discard_after_failed_publish_writes_nothing(state_dir, monkeypatch):
    log = SessionLog.create(state_dir, "s1", make_header("s1"), claims=(claims := set()))
    log.append("approval/policy", {"policy": "ask", "source": "config"})
    real = os.fsync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(StorageWriteError):
        await log.flush()
    monkeypatch.setattr(os, "fsync", real)
    assert log.discard_unpublished() is True
    with pytest.raises(StorageError):
        log.append("approval/policy", {"policy": "never", "source": "config"})
    await log.aclose()
    assert claims == set()
    with pytest.raises(FileNotFoundError):
        read_log(state_dir / "sessions" / "s1", "s1")
    # The id is free again: a new log can be created and published under it.
    again = SessionLog.create(state_dir, "s1", make_header("s1"))
    again.append("approval/policy", {"policy": "ask", "source": "config"})
    await again.flush()
    await again.aclose()
    assert [e.type for e in read_log(state_dir / "sessions" / "s1", "s1").events] == [
        "approval/policy"]


async def test_discard_keeps_a_published_log(state_dir):
    log = SessionLog.create(state_dir, "s1", make_header("s1"))
    log.append("approval/policy", {"policy": "ask", "source": "config"})
    await log.flush()
    log.append("sandbox/mode", {"mode": "read-only", "source": "config"})
    assert log.discard_unpublished() is False
    await log.aclose()
    assert len(read_log(state_dir / "sessions" / "s1", "s1").events) == 2


def _fsync_recorder(monkeypatch, fail_when):
    """Replace os.fsync: record the path of every fd fsynced; raise EIO when ``fail_when``."""
    real = os.fsync
    seen: list[str] = []

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if fail_when(path, seen):
            raise OSError(errno.EIO, "injected")
        seen.append(path)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


async def test_discard_removes_the_directory_a_failed_publish_made(state_dir, monkeypatch):
    (state_dir / "sessions").mkdir(parents=True)
    log = SessionLog.create(state_dir, "s1", make_header("s1"))
    log.append("approval/policy", {"policy": "ask", "source": "config"})
    _fsync_recorder(monkeypatch, lambda path, seen: path.endswith(".tmp"))  # the log's fsync
    with pytest.raises(StorageWriteError):
        await log.flush()
    assert (state_dir / "sessions" / "s1" / "session.lock").exists()
    assert log.discard_unpublished()
    await log.aclose()
    assert not (state_dir / "sessions" / "s1").exists()


async def test_parent_fsync_is_retried_after_it_failed(state_dir, monkeypatch):
    (state_dir / "sessions").mkdir(parents=True)
    sessions = str(state_dir / "sessions")
    failed = []

    def fail_once(path, seen):
        if path == sessions and not failed:
            failed.append(path)
            return True
        return False

    seen = _fsync_recorder(monkeypatch, fail_once)
    log = SessionLog.create(state_dir, "s1", make_header("s1"))
    log.append("approval/policy", {"policy": "ask", "source": "config"})
    with pytest.raises(StorageWriteError):
        await log.flush()  # mkdir sessions/s1 happened; its entry's fsync failed
    await log.flush()
    await log.aclose()
    assert seen.count(sessions) == 1  # retried, although sessions/s1 existed by then
    assert len(read_log(state_dir / "sessions" / "s1", "s1").events) == 1


async def test_sidecar_parent_fsync_is_retried_after_it_failed(tmp_path, monkeypatch):
    session_dir = tmp_path / "s1"
    session_dir.mkdir()
    failed = []

    def fail_once(path, seen):
        if path == str(session_dir) and not failed:
            failed.append(path)
            return True
        return False

    seen = _fsync_recorder(monkeypatch, fail_once)
    pending = PendingOutput(session_dir, "c1")
    with pytest.raises(StorageWriteError):
        await pending.checkpoint([["r", {"text": "a"}]], base=True)
    await pending.checkpoint([["r", {"text": "b"}]], base=True)
    assert seen.count(str(session_dir)) == 1  # pending/'s entry, retried
    pending.retire()
