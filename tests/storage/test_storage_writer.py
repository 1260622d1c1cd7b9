"""SessionLog: publish, round trip, coalescing, group commit, failed writes (STORAGE.md §2, §4).

Real files and real fsync. The only fakes are fault injections at the os-call level
(``os.fsync`` / ``os.pwrite`` / ``os.link`` monkeypatched to fail), named as such.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess

import pytest
import trio

from dshd.storage import (
    LockHeld,
    LogTooNew,
    SessionLog,
    StorageError,
    StorageWriteError,
    read_log,
)
from dshd.storage.format import TRAILER_SIZE, encode_trailer, ZSTD_MAGIC, decode_header, scan_zstd_frame
from dshd.storage.torn import decompress_frame as _decompress_frame

from storage_helpers import make_header, turn_events, write_log

ZSTD = shutil.which("zstd") or "/usr/bin/zstd"


def frames_of(path) -> list[bytes]:
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        scan = scan_zstd_frame(data, pos)
        assert scan.kind == "frame", scan
        out.append(_decompress_frame(data[pos : scan.end]))
        # Every frame is followed by its trailer (format.encode_trailer).
        trailer = data[scan.end : scan.end + TRAILER_SIZE]
        assert trailer == encode_trailer(data[pos : scan.end])
        pos = scan.end + TRAILER_SIZE
    return out


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_round_trip(state_dir, compression):
    log = SessionLog.create(state_dir, "s1", make_header(), compression=compression)
    appended = [log.append(t, d) for t, d in turn_events(3)]
    assert await log.flush() == 2
    appended.append(log.append("message/user", {"text": "hi", "turnId": "t2"}))
    appended.append(log.append("x/extension", {"k": [1, 2.5, None]}, ignorable=True))
    await log.aclose()

    read = read_log(state_dir / "sessions" / "s1", "s1")
    assert read.header == make_header()
    assert read.events == appended
    assert [e.seq for e in read.events] == [0, 1, 2, 3, 4]
    assert not read.torn and read.recovered == [] and read.valid_bytes == read.size
    assert read.compression == compression

    again = await SessionLog.open_for_write(state_dir, "s1")
    assert again.events == appended
    assert again.last_seq == again.durable_seq == 4
    ev = again.append("turn/end", {"turnId": "t2", "reason": "completed"})
    assert ev.seq == 5
    await again.aclose()
    assert read_log(state_dir / "sessions" / "s1", "s1").events == [*appended, ev]


async def test_frames_header_alone_then_one_per_batch_and_zstdcat(state_dir):
    path = await write_log(state_dir, [turn_events(2), turn_events(3, 2)])
    frames = frames_of(path)
    assert len(frames) == 3
    assert frames[0].count(b"\n") == 1 and decode_header(frames[0][:-1]) == make_header()
    assert frames[1].count(b"\n") == 2 and frames[2].count(b"\n") == 3
    out = subprocess.run([ZSTD, "-dc", str(path)], capture_output=True, check=True).stdout
    assert out == b"".join(frames)
    lines = out.decode().splitlines()
    assert lines[0].startswith('{"type":"session","version":1,"id":"s1"')
    assert lines[1] == '{"seq":0,"time":1700000000001,"type":"turn/start","data":{"turnId":"t0"}}'


async def test_plain_log_is_the_same_lines(state_dir, tmp_path):
    zpath = await write_log(state_dir, [turn_events(2)])
    ppath = await write_log(tmp_path / "other", [turn_events(2)], compression="none")
    assert ppath.name == "session.v1.jsonl"
    plain = subprocess.run([ZSTD, "-dc", str(zpath)], capture_output=True, check=True).stdout
    assert ppath.read_bytes() == plain


async def test_unicode_round_trips_and_lone_surrogates_are_refused(state_dir):
    text = "ok \ufffd\ufffd bad bytes, \u2028 sep, \x00 nul, \x1b[31m, astral \U0001f600, a\nb\r\n"
    log = SessionLog.create(state_dir, "s1", make_header(), compression="none")
    ev = log.append("tool/result", {"callId": "c1", "isError": False, "content": text, "details": {}})
    with pytest.raises(ValueError):
        log.append("message/user", {"text": "lone \ud800"})
    assert log.last_seq == ev.seq  # no seq consumed
    await log.aclose()
    raw = log.path.read_bytes()
    assert raw.count(b"\n") == 2  # newlines inside strings are escaped; U+2028 is not a line break
    assert read_log(log.session_dir, "s1").events == [ev]


async def test_permissions_and_publish_layout(state_dir):
    path = await write_log(state_dir, [turn_events(1)])
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(state_dir / "sessions").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent / "session.lock").st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "session.lock", "session.v1.jsonl.zst", "summary.json"]
    assert stat.S_IMODE(os.stat(path.parent / "summary.json").st_mode) == 0o600
    assert os.stat(path).st_nlink == 1  # the temp name is gone


async def test_create_does_no_io_and_empty_create_publishes_nothing(state_dir):
    log = SessionLog.create(state_dir, "s1", make_header())
    log.append("turn/start", {"turnId": "t"})
    assert not state_dir.exists()
    quiet = SessionLog.create(state_dir, "s2", make_header("s2"))
    await quiet.aclose()
    assert not state_dir.exists()
    await log.aclose()  # final flush publishes
    assert [e.data for e in read_log(log.session_dir, "s1").events] == [{"turnId": "t"}]


async def test_flush_of_an_empty_created_log_publishes_the_header(state_dir):
    log = SessionLog.create(state_dir, "s1", make_header())
    assert await log.flush() == -1
    read = read_log(log.session_dir, "s1")
    assert read.events == [] and read.header == make_header()
    await log.aclose()


async def test_publish_never_overwrites_an_existing_log(state_dir):
    path = await write_log(state_dir, [turn_events(1)])
    before = path.read_bytes()
    log = SessionLog.create(state_dir, "s1", make_header())
    log.append("turn/start", {"turnId": "other"})
    with pytest.raises(StorageWriteError) as info:
        await log.flush()
    assert isinstance(info.value.__cause__, FileExistsError)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    with pytest.raises(StorageWriteError):
        await log.aclose()


async def test_in_process_claims_and_second_handle(state_dir):
    claims: set[str] = set()
    first = SessionLog.create(state_dir, "s1", make_header(), claims=claims)
    assert claims == {"s1"}
    with pytest.raises(LockHeld, match="this process"):
        SessionLog.create(state_dir, "s1", make_header(), claims=claims)
    with pytest.raises(LockHeld):
        await SessionLog.open_for_write(state_dir, "s1", claims=claims)
    await first.flush()
    # Without the claim set, the flock itself refuses a second handle in this process.
    with pytest.raises(LockHeld) as info:
        await SessionLog.open_for_write(state_dir, "s1")
    assert info.value.holder == os.getpid()
    await first.aclose()
    assert claims == set()
    second = await SessionLog.open_for_write(state_dir, "s1", claims=claims)
    assert claims == {"s1"}
    await second.aclose()


async def test_invalid_ids_and_arguments(state_dir):
    for bad in ["", "a/b", "..", "__proto__", "x" * 65, "a b"]:
        with pytest.raises(ValueError):
            SessionLog.create(state_dir, bad, make_header(bad))
        with pytest.raises(ValueError):
            await SessionLog.open_for_write(state_dir, bad)
        with pytest.raises(ValueError):
            read_log(state_dir, bad)
    with pytest.raises(ValueError):
        SessionLog.create(state_dir, "s1", make_header("s2"))
    with pytest.raises(ValueError):
        SessionLog.create(state_dir, "s1", make_header(), compression="gzip")
    log = SessionLog.create(state_dir, "s1", make_header())
    with pytest.raises(ValueError, match="unknown event type"):
        log.append("tool/teleport", {})
    with pytest.raises(TypeError):
        log.append("turn/start", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        log.append("turn/start", {"x": object()})
    assert log.last_seq == -1
    with pytest.raises(ValueError):
        await log.wait_durable(0)
    await log.aclose()
    with pytest.raises(StorageError):
        log.append("turn/start", {"turnId": "late"})
    with pytest.raises(FileNotFoundError):
        await SessionLog.open_for_write(state_dir, "nope")


async def test_coalesced_write_lands_by_itself(state_dir, autojump_clock):
    log = SessionLog.create(state_dir, "s1", make_header(), coalesce=0.2)
    await log.flush()
    frames_before = log.statistics()["frames"]
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        t0 = trio.current_time()
        log.append("turn/start", {"turnId": "a"})
        await trio.sleep(0.15)
        second = log.append("turn/start", {"turnId": "b"})
        await log.wait_durable(second.seq, flush=False)
        elapsed = trio.current_time() - t0
        # At the deadline of the FIRST event: the second did not push it to 0.35.
        assert 0.2 <= elapsed < 0.3
        assert log.statistics()["frames"] == frames_before + 1
        assert log.durable_seq == 1
        # Nothing buffered: the timer sleeps and writes nothing more.
        await trio.sleep(5)
        assert log.statistics()["frames"] == frames_before + 1
        third = log.append("turn/start", {"turnId": "c"})
        await log.wait_durable(third.seq, flush=False)
        await log.aclose()  # the run task returns
    assert [e.data["turnId"] for e in read_log(log.session_dir, "s1").events] == ["a", "b", "c"]


async def test_group_commit_shares_fsyncs(state_dir):
    log = SessionLog.create(state_dir, "s1", make_header())
    await log.flush()
    fsyncs_before = log.statistics()["fsyncs"]
    results: dict[int, int] = {}

    async def flusher(i: int) -> None:
        ev = log.append("turn/start", {"turnId": f"t{i}"})
        durable = await log.flush()
        assert durable >= ev.seq
        results[i] = ev.seq

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(flusher, i)
    fsyncs = log.statistics()["fsyncs"] - fsyncs_before
    assert len(results) == 20
    assert 1 <= fsyncs < 20
    assert log.durable_seq == 19
    await log.aclose()
    assert len(read_log(log.session_dir, "s1").events) == 20


class FailingFsync:
    """Fault injection: os.fsync raises EIO while ``failing`` is set."""

    def __init__(self, real):
        self.real = real
        self.failing = False
        self.calls = 0

    def __call__(self, fd):
        self.calls += 1
        if self.failing:
            raise OSError(errno.EIO, "injected fsync failure")
        return self.real(fd)


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_failed_fsync_keeps_the_batch_and_a_retry_lands_it(state_dir, monkeypatch, compression):
    fault = FailingFsync(os.fsync)
    monkeypatch.setattr(os, "fsync", fault)
    log = SessionLog.create(state_dir, "s1", make_header(), compression=compression)
    log.append("turn/start", {"turnId": "t0"})
    await log.flush()
    size = os.path.getsize(log.path)

    fault.failing = True
    for i in range(1, 4):
        log.append("turn/start", {"turnId": f"t{i}"})
    for _ in range(2):  # every flush retries and raises until one succeeds
        with pytest.raises(StorageWriteError) as info:
            await log.flush()
        assert isinstance(info.value.__cause__, OSError)
        assert os.path.getsize(log.path) == size
        stats = log.statistics()
        assert stats["buffered"] == 3 and stats["durable_seq"] == 0 and stats["failed"]
    with pytest.raises(StorageWriteError):
        await log.wait_durable(3)
    with pytest.raises(StorageWriteError):
        await log.wait_durable(3, flush=False)
    assert [e.data["turnId"] for e in read_log(log.session_dir, "s1").events] == ["t0"]

    fault.failing = False
    assert await log.flush() == 3
    assert log.statistics()["failed"] is None and log.statistics()["buffered"] == 0
    await log.aclose()
    read = read_log(log.session_dir, "s1")
    assert [e.data["turnId"] for e in read.events] == ["t0", "t1", "t2", "t3"]
    assert not read.torn


async def test_partial_write_is_rolled_back(state_dir, monkeypatch):
    log = SessionLog.create(state_dir, "s1", make_header())
    log.append("turn/start", {"turnId": "t0"})
    await log.flush()
    size = os.path.getsize(log.path)
    real_pwrite = os.pwrite

    def half_then_enospc(fd, data, offset):  # fault injection: a short write, then ENOSPC
        if len(data) > 1:
            return real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(errno.ENOSPC, "injected: no space left")

    monkeypatch.setattr(os, "pwrite", half_then_enospc)
    log.append("message/user", {"text": "x" * 5000})
    with pytest.raises(StorageWriteError):
        await log.flush()
    assert os.path.getsize(log.path) == size
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    await log.aclose()
    assert [e.type for e in read_log(log.session_dir, "s1").events] == ["turn/start", "message/user"]


async def test_failed_publish_is_retried(state_dir, monkeypatch):
    real_link = os.link
    calls = []

    def failing_link(src, dst, **kw):  # fault injection: link() fails once
        calls.append(dst)
        if len(calls) == 1:
            raise OSError(errno.EIO, "injected link failure")
        return real_link(src, dst, **kw)

    monkeypatch.setattr(os, "link", failing_link)
    log = SessionLog.create(state_dir, "s1", make_header())
    log.append("turn/start", {"turnId": "t0"})
    with pytest.raises(StorageWriteError):
        await log.flush()
    assert not log.path.exists()
    assert [p.name for p in log.session_dir.iterdir()] == ["session.lock"]
    assert await log.flush() == 0
    await log.aclose()
    assert len(read_log(log.session_dir, "s1").events) == 1


async def test_timed_writes_pause_after_a_failure(state_dir, monkeypatch, autojump_clock):
    fault = FailingFsync(os.fsync)
    monkeypatch.setattr(os, "fsync", fault)
    log = SessionLog.create(state_dir, "s1", make_header(), coalesce=0.2)
    await log.flush()
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        fault.failing = True
        ev = log.append("turn/start", {"turnId": "t0"})
        with pytest.raises(StorageWriteError):
            await log.wait_durable(ev.seq, flush=False)  # raised once the timed write failed
        attempts = log.statistics()["writes"]
        await trio.sleep(10)
        assert log.statistics()["writes"] == attempts  # paused: no timed retries
        fault.failing = False
        await log.flush()  # a caller's retry succeeds and resumes timed writes
        second = log.append("turn/start", {"turnId": "t1"})
        await log.wait_durable(second.seq, flush=False)
        await log.aclose()
    assert len(read_log(log.session_dir, "s1").events) == 2


async def test_newer_version_is_refused(state_dir):
    path = await write_log(state_dir, [], compression="none")
    path.write_bytes(path.read_bytes().replace(b'"version":1', b'"version":2'))
    with pytest.raises(LogTooNew, match="newer dshd: upgrade"):
        await SessionLog.open_for_write(state_dir, "s1")
    path.rename(path.parent / "session.v2.jsonl")
    with pytest.raises(LogTooNew, match="newer dshd: upgrade"):
        read_log(path.parent, "s1")


async def test_unknown_event_type_is_too_new_unless_ignorable(state_dir):
    path = await write_log(state_dir, [turn_events(1)], compression="none")
    data = path.read_bytes()
    path.write_bytes(data + b'{"seq":1,"time":1,"type":"future/thing","data":{},"ignorable":true}\n')
    assert read_log(path.parent, "s1").events[-1].type == "future/thing"
    path.write_bytes(data + b'{"seq":1,"time":1,"type":"future/thing","data":{}}\n')
    with pytest.raises(LogTooNew):
        read_log(path.parent, "s1")


async def test_magic_constant():
    assert ZSTD_MAGIC == (0xFD2FB528).to_bytes(4, "little")
