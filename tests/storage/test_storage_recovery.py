"""Reading and recovery: torn tails at every byte, damage, list (STORAGE.md §5)."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest
import zstandard

from dshd.storage import LogCorrupt, SessionLog, list_session_dirs, read_log
from dshd.storage.format import encode_line, scan_zstd_frame
from storage_helpers import make_header, turn_events, write_log


def frame_starts(data: bytes) -> list[int]:
    """Starts of the data frames (each followed by its trailer, which is skipped)."""
    starts, pos = [], 0
    while pos < len(data):
        scan = scan_zstd_frame(data, pos)
        assert scan.kind in ("frame", "skippable")
        if scan.kind == "frame":
            starts.append(pos)
        pos = scan.end
    return starts


def line_starts(data: bytes) -> list[int]:
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos = data.index(b"\n", pos) + 1
    return starts


def place(root: Path, name: str, data: bytes) -> Path:
    """A session directory ``root/name/sessions/s1`` holding ``data`` as its log."""
    session_dir = root / name / "sessions" / "s1"
    session_dir.mkdir(parents=True)
    (session_dir / log_name(data)).write_bytes(data)
    return session_dir


def log_name(data: bytes) -> str:
    return "session.v1.jsonl.zst" if data[:4] == b"\x28\xb5\x2f\xfd" else "session.v1.jsonl"


async def check_writer_fixes_torn_tail(session_dir: Path, kept: list, data: bytes, valid: int) -> None:
    state = session_dir.parent.parent
    log = await SessionLog.open_for_write(state, "s1")
    assert log.events == kept
    new = log.append("turn/end", {"turnId": "t0", "reason": "completed"})
    assert new.seq == len(kept)
    await log.aclose()
    after = read_log(session_dir, "s1")
    assert not after.torn
    assert after.events == [*kept, new]
    assert (session_dir / log_name(data)).read_bytes()[:valid] == data[:valid]


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_torn_last_frame_at_every_byte(state_dir, tmp_path, compression):
    path = await write_log(state_dir, [turn_events(3), turn_events(4, 3)], compression=compression)
    data = path.read_bytes()
    full = read_log(path.parent, "s1").events
    assert len(full) == 7
    if compression == "zstd":
        last_start = frame_starts(data)[-1]
    else:
        last_start = line_starts(data)[4]  # header + 3 lines of the first batch
    for cut in range(last_start, len(data)):
        torn_data = data[:cut]
        session_dir = place(tmp_path, f"cut{cut}", torn_data)
        read = read_log(session_dir, "s1")
        assert (session_dir / log_name(data)).read_bytes() == torn_data  # reads never write
        kept = read.events
        assert kept == full[: len(kept)] and len(kept) >= 3
        assert read.recovered == kept[len(kept) - len(read.recovered) :]
        if compression == "zstd":
            if cut == last_start:
                assert not read.torn and len(kept) == 3
            else:
                assert read.torn and read.valid_bytes == last_start
                if cut >= len(data) - 4:  # only (part of) the checksum is missing
                    assert len(read.recovered) == 4
        else:
            complete_lines = torn_data.count(b"\n") - 1
            if torn_data.endswith(b"\n"):
                assert not read.torn and len(kept) == complete_lines and read.recovered == []
            else:
                assert read.torn
                assert read.valid_bytes == torn_data.rindex(b"\n") + 1
                whole_record = data[cut : cut + 1] == b"\n"
                assert len(read.recovered) == (1 if whole_record else 0)
                assert len(kept) == complete_lines + len(read.recovered)
        await check_writer_fixes_torn_tail(session_dir, kept, torn_data, read.valid_bytes)


async def test_torn_multi_block_frame_keeps_complete_lines(state_dir, tmp_path):
    big = [("message/user", {"text": secrets.token_hex(60)}) for _ in range(3000)]
    path = await write_log(state_dir, [turn_events(2), big])
    data = path.read_bytes()
    full = read_log(path.parent, "s1").events
    start = frame_starts(data)[-1]
    scan = scan_zstd_frame(data, start)
    assert len(scan.pieces) >= 3  # header end + at least two blocks
    cuts = sorted({c for p in scan.pieces for c in (p - 1, p, p + 1)} | {len(data) - 2})
    cuts = [c for c in cuts if start < c < len(data)]
    previous = -1
    for cut in cuts:
        session_dir = place(tmp_path, f"big{cut}", data[:cut])
        read = read_log(session_dir, "s1")
        assert read.torn and read.valid_bytes == start
        assert read.events == full[: len(read.events)]
        assert len(read.recovered) >= previous  # more bytes never keep fewer records
        previous = len(read.recovered)
        if cut > scan.pieces[1]:
            assert read.recovered, cut  # a complete block gives complete lines
    assert previous == len(big)  # only the checksum missing: everything recovered
    session_dir = place(tmp_path, "fix", data[: scan.pieces[2] + 1])
    read = read_log(session_dir, "s1")
    await check_writer_fixes_torn_tail(session_dir, read.events, data[: scan.pieces[2] + 1], start)


async def test_zero_filled_tail_is_torn(state_dir, tmp_path):
    path = await write_log(state_dir, [turn_events(2)])
    data = path.read_bytes()
    session_dir = place(tmp_path, "zeros", data + b"\0" * 4096)
    read = read_log(session_dir, "s1")
    assert read.torn and read.valid_bytes == len(data) and len(read.events) == 2
    await check_writer_fixes_torn_tail(session_dir, read.events, data, len(data))


def assert_corrupt(session_dir: Path, offset: int) -> LogCorrupt:
    with pytest.raises(LogCorrupt) as info:
        read_log(session_dir, "s1")
    err = info.value
    assert err.session_id == "s1" and err.offset == offset
    assert err.path == session_dir / log_name((err.path).read_bytes())
    message = str(err)
    assert "s1" in message and str(err.path) in message and f"byte {offset}" in message
    return err


async def test_flipped_byte_in_an_earlier_frame_is_corruption(state_dir, tmp_path):
    path = await write_log(state_dir, [turn_events(3), turn_events(3, 3), turn_events(3, 6)])
    data = path.read_bytes()
    starts = frame_starts(data)
    victim, end = starts[2], starts[3]
    # Every byte of the frame, header included (XOR 0x41 leaves the descriptor's unused bit 4
    # alone: decoders must ignore that one).
    for i in range(victim, end):
        damaged = bytearray(data)
        damaged[i] ^= 0x41
        session_dir = place(tmp_path, f"flip{i}", bytes(damaged))
        assert_corrupt(session_dir, victim)
    # The writer refuses too, and leaves the lock free.
    with pytest.raises(LogCorrupt):
        await SessionLog.open_for_write(session_dir.parent.parent, "s1")
    with pytest.raises(LogCorrupt):
        await SessionLog.open_for_write(session_dir.parent.parent, "s1")


async def test_damaged_last_complete_frame_is_corruption_not_torn(state_dir, tmp_path):
    path = await write_log(state_dir, [turn_events(3), turn_events(3, 3)])
    data = bytearray(path.read_bytes())
    last = frame_starts(bytes(data))[-1]
    data[-17] ^= 0xFF  # checksum byte of the complete last frame (its 16-byte trailer follows)
    assert_corrupt(place(tmp_path, "last", bytes(data)), last)
    data[-17] ^= 0xFF
    data[-1] ^= 0xFF  # the trailer's CRC-32: damage too, named at its frame
    assert_corrupt(place(tmp_path, "trailer", bytes(data)), last)


async def test_cut_frame_followed_by_complete_frames_is_corruption(state_dir, tmp_path):
    path = await write_log(state_dir, [turn_events(3), turn_events(3, 3), turn_events(3, 6)])
    data = path.read_bytes()
    starts = frame_starts(data)
    # Stretch the first block header of frame 2 so that its structure runs past EOF.
    header_end = scan_zstd_frame(data, starts[2]).pieces[0]
    damaged = bytearray(data)
    damaged[header_end : header_end + 3] = ((100_000 << 3) | (2 << 1)).to_bytes(3, "little")
    assert_corrupt(place(tmp_path, "stretch", bytes(damaged)), starts[2])
    # Bytes missing from the middle: frame 2 now swallows the start of frame 3.
    assert_corrupt(place(tmp_path, "hole", data[: starts[2] + 10] + data[starts[3] - 5 :]), starts[2])


async def test_seq_gap_and_bad_lines(state_dir, tmp_path):
    header = encode_line(make_header())
    ev = lambda seq: b'{"seq":%d,"time":1,"type":"turn/start","data":{"turnId":"t"}}\n' % seq  # noqa: E731
    c = zstandard.ZstdCompressor(write_checksum=True)
    gap = c.compress(header) + c.compress(ev(0) + ev(1)) + c.compress(ev(3))
    err = assert_corrupt(place(tmp_path, "gap", gap), len(gap) - len(c.compress(ev(3))))
    assert "seq gap" in err.reason
    two_line_header = c.compress(header + ev(0))
    assert_corrupt(place(tmp_path, "hdr", two_line_header), 0)
    no_newline = c.compress(header) + c.compress(ev(0)[:-1])
    assert_corrupt(place(tmp_path, "nonl", no_newline), len(c.compress(header)))
    no_checksum = c.compress(header) + zstandard.ZstdCompressor().compress(ev(0))
    assert_corrupt(place(tmp_path, "nock", no_checksum), len(c.compress(header)))
    wrong_id = c.compress(encode_line(make_header("other")))
    assert_corrupt(place(tmp_path, "id", wrong_id), 0)
    assert_corrupt(place(tmp_path, "empty", b""), 0)
    # plain: the offset is the line's
    plain = header + ev(0) + b'{"seq":1,"time":1,"type":"turn/start","data":{"turnId":\n' + ev(2)
    assert_corrupt(place(tmp_path, "plain", plain), len(header) + len(ev(0)))
    assert_corrupt(place(tmp_path, "plaingap", header + ev(0) + ev(2)), len(header) + len(ev(0)))
    assert_corrupt(place(tmp_path, "plainhdr", header[:-5]), 0)


async def test_both_formats_present_is_corruption(state_dir):
    path = await write_log(state_dir, [turn_events(1)])
    shutil.copy(path, path.parent / "session.v1.jsonl")
    with pytest.raises(LogCorrupt):
        read_log(path.parent, "s1")


async def test_list_session_dirs(state_dir):
    assert list_session_dirs(state_dir) == []
    for sid in ["b", "a", "damaged"]:
        await write_log(state_dir, [turn_events(1)], session_id=sid)
    sessions = state_dir / "sessions"
    (sessions / "damaged" / "session.v1.jsonl.zst").write_bytes(b"junk")
    (sessions / "not valid").mkdir()
    (sessions / "__proto__").mkdir()
    (sessions / "afile").write_text("x")
    os.symlink(sessions / "a", sessions / "link")
    assert list_session_dirs(state_dir) == ["a", "b", "damaged"]
    with pytest.raises(LogCorrupt):
        read_log(sessions / "damaged", "damaged")
    with pytest.raises(FileNotFoundError):
        read_log(sessions / "missing", "missing")


async def test_torn_tail_is_fixed_on_the_first_write_only(state_dir):
    path = await write_log(state_dir, [turn_events(2), turn_events(2, 2)])
    data = path.read_bytes()
    cut = data[:-36]  # inside the last frame (before its checksum and trailer): nothing kept
    path.write_bytes(cut)
    log = await SessionLog.open_for_write(state_dir, "s1")
    assert log.last_seq == log.durable_seq == 1
    await log.aclose()  # nothing written, nothing to re-append: the file is untouched
    assert path.read_bytes() == cut
    path.write_bytes(data[:-18])  # only checksum bytes missing: both records recovered
    log = await SessionLog.open_for_write(state_dir, "s1")
    assert log.last_seq == 3 and log.durable_seq == 1
    assert await log.flush() == 3  # the fix itself is a write: truncate, fsync, re-append
    await log.aclose()
    read = read_log(path.parent, "s1")
    assert not read.torn and len(read.events) == 4
