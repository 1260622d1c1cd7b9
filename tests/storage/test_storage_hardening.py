"""Storage hardening (issue 10): the locks cannot be removed from under a writer, and a failed
durable change can be taken back (STORAGE.md §4). Thread exhaustion: tests/durability."""

from __future__ import annotations

import os

import pytest

from dshd.storage import DaemonLock, LockHeld, SessionLog, StorageWriteError, read_log
from dshd.storage.errors import LockLost
from storage_helpers import make_header, turn_events, write_log


async def test_deleted_session_lock_still_excludes_a_second_writer(state_dir):
    path = await write_log(state_dir, [turn_events(1)])
    log = await SessionLog.open_for_write(state_dir, "s1")
    os.unlink(path.parent / "session.lock")
    with pytest.raises(LockHeld) as info:  # the session directory itself is locked
        await SessionLog.open_for_write(state_dir, "s1")
    assert info.value.holder == os.getpid()
    await log.aclose()


@pytest.mark.parametrize("how", ["deleted", "replaced", "directory-replaced"])
async def test_writer_stops_when_its_lock_no_longer_guards_the_path(state_dir, how):
    path = await write_log(state_dir, [turn_events(1)])
    session_dir = path.parent
    log = await SessionLog.open_for_write(state_dir, "s1")
    before = path.read_bytes()
    if how == "deleted":
        os.unlink(session_dir / "session.lock")
    elif how == "replaced":
        os.unlink(session_dir / "session.lock")
        (session_dir / "session.lock").write_text("12345\n")
    else:
        os.rename(session_dir, session_dir.with_name("s1-moved"))
        os.mkdir(session_dir)
    log.append("turn/start", {"turnId": "t1"})
    with pytest.raises(StorageWriteError) as info:
        await log.flush()
    cause = info.value.__cause__
    assert isinstance(cause, LockLost)
    assert "removed or replaced" in str(info.value) and "writes are stopped" in str(info.value)
    target = path if how != "directory-replaced" else session_dir.with_name("s1-moved") / path.name
    assert target.read_bytes() == before  # nothing was written under the lost lock
    with pytest.raises(StorageWriteError):  # and it stays stopped
        await log.flush()
    with pytest.raises(StorageWriteError):
        await log.aclose()


def test_daemon_lock_survives_deleting_its_file(tmp_path):
    state = tmp_path / "state"
    first = DaemonLock(state)
    first.acquire()
    os.unlink(state / "dshd.lock")
    with pytest.raises(LockHeld) as info:
        DaemonLock(state).acquire()
    assert info.value.holder == os.getpid()  # from /proc/locks: the file is gone
    first.release()
    with DaemonLock(state) as again:
        assert again.held


async def test_retract_takes_back_only_the_unwritten_tail(state_dir, monkeypatch):
    import errno

    log = SessionLog.create(state_dir, "s1", make_header())
    log.append("turn/start", {"turnId": "t0"})
    await log.flush()
    a = log.append("approval/policy", {"policy": "ask", "source": "x"})
    assert log.retract(a.seq, a.seq) is True
    assert log.last_seq == 0 and [e.seq for e in log.events] == [0]
    b = log.append("approval/policy", {"policy": "ask", "source": "x"})
    assert b.seq == 1  # the seq is free again
    c = log.append("turn/start", {"turnId": "t1"})
    assert log.retract(b.seq, b.seq) is False  # not the tail: somebody appended after it
    await log.flush()
    assert log.retract(c.seq, c.seq) is False  # durable: never taken back
    real = os.fsync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    d = log.append("approval/policy", {"policy": "never", "source": "x"})
    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(StorageWriteError):
        await log.flush()
    monkeypatch.setattr(os, "fsync", real)
    assert log.retract(d.seq, d.seq) is True  # failed, never written: taken back
    assert log.statistics()["buffered"] == 0
    await log.aclose()
    assert [e.seq for e in read_log(state_dir / "sessions" / "s1", "s1").events] == [0, 1, 2]


def test_daemon_lock_verify_notices_a_moved_state_directory(tmp_path):
    from dshd.storage.errors import StateDirMoved

    state = tmp_path / "state"
    with DaemonLock(state) as held:
        held.verify()
        os.unlink(state / "dshd.lock")
        held.verify()  # the directory lock is the one that counts
        os.rename(state, tmp_path / "state.old")
        os.mkdir(state)
        with pytest.raises(StateDirMoved) as info:
            held.verify()
        assert str(state) in str(info.value) and "moved or replaced" in str(info.value)
        with DaemonLock(state) as second:  # what a second dshd can now do
            assert second.held
        os.rename(state, tmp_path / "state.second")
        os.rename(tmp_path / "state.old", state)
        held.verify()  # moved back: ours again
