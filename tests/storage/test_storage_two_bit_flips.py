"""Torn or damaged, decided by structure (STORAGE.md §5): every frame is followed by a trailer
(format.encode_trailer) written in the same append, so an append cut by a crash never ends in
its trailer. A last frame whose headers were flipped so that it *looks* cut short, while its
trailer is there, is damage -- however many header bits were flipped. Exhaustive over every
single- and two-bit flip of the last frame's header, its first block header and the 8 bytes
after it; a fixed-seed sample of three-bit flips over the whole last frame and trailer.
Verdict for each: refused (LogCorrupt, the file unchanged) or the same events; never a durable
event dropped as a torn tail."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import zstandard

from dshd.storage import LogCorrupt, SessionLog, StorageError, read_log
from dshd.storage.format import encode_line, scan_zstd_frame
from dshd.storage.reader import parse_log
from storage_helpers import make_header, turn_events, write_log


def _call_pair(call_id: str, text: str) -> list[tuple[str, dict]]:
    return [
        ("tool/call", {"callId": call_id, "name": "bash", "arguments": '{"command":"echo"}'}),
        ("tool/result", {"callId": call_id, "isError": False, "exitCode": 0, "content": text,
                         "details": {"truncation": {"totalBytes": len(text)}}}),
    ]


def _last_data_frame(data: bytes) -> tuple[int, int]:
    """(start, end of the first block header + 8 bytes) of the last data frame."""
    pos, start = 0, 0
    while pos < len(data):
        scan = scan_zstd_frame(data, pos)
        if scan.kind == "frame":
            start = pos
        pos = scan.end
    header_end = scan_zstd_frame(data, start).pieces[0]
    return start, header_end + 3 + 8


def _judge(data: bytes, flips: tuple[int, ...], path: Path, full: list) -> str:
    damaged = bytearray(data)
    for bit in flips:
        damaged[bit // 8] ^= 1 << (bit % 8)
    try:
        read = parse_log(bytes(damaged), session_id="s1", path=path, compression="zstd")
    except StorageError:
        return "refused"
    assert read.events == full and not read.torn, (
        f"flips {[(b // 8, 1 << (b % 8)) for b in flips]}: torn={read.torn}, kept "
        f"{len(read.events)} of {len(full)} events (durable events dropped or changed)")
    return "identical"


async def _repro_log(state_dir: Path) -> Path:
    return await write_log(state_dir, [turn_events(2), _call_pair("c1", "hello\n" * 20)])


async def test_every_one_and_two_bit_flip_of_the_last_frames_headers(state_dir):
    path = await _repro_log(state_dir)
    data = path.read_bytes()
    full = parse_log(data, session_id="s1", path=path, compression="zstd").events
    start, end = _last_data_frame(data)
    bits = range(start * 8, end * 8)
    outcomes: dict[str, int] = {}
    combos = itertools.chain(((b,) for b in bits), itertools.combinations(bits, 2))
    for flips in combos:
        outcome = _judge(data, flips, path, full)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    n = len(bits)
    assert sum(outcomes.values()) == n + n * (n - 1) // 2 and n >= 18 * 8
    assert outcomes["refused"] > 100 * outcomes.get("identical", 0), outcomes


async def test_three_bit_flips_over_the_last_frame_and_trailer_sampled(state_dir):
    path = await _repro_log(state_dir)
    data = path.read_bytes()
    full = parse_log(data, session_id="s1", path=path, compression="zstd").events
    start, end = _last_data_frame(data)
    rng = random.Random(20261201)  # fixed seed: the same 4000 combinations every run
    headers = range(start * 8, end * 8)
    anywhere = range(start * 8, len(data) * 8)
    for _ in range(4000):
        # two in the headers (what stretches a block and its content size), one anywhere
        flips = (*rng.sample(headers, 2), rng.choice(anywhere))
        if len(set(flips)) == 3:
            _judge(data, flips, path, full)


async def test_two_bit_flip_refused_on_open_and_the_file_is_unchanged(state_dir):
    """The attacker's case through the write handle (what `dsh fsck` and an online open use):
    refused, nothing truncated, no TOOL_OUTCOME_UNKNOWN appended."""
    path = await _repro_log(state_dir)
    data = path.read_bytes()
    start, _ = _last_data_frame(data)
    header_end = scan_zstd_frame(data, start).pieces[0]
    damaged = bytearray(data)
    damaged[header_end - 1] ^= 0x02  # the content size
    damaged[header_end + 1] ^= 0x01  # the first block's size: its structure now runs past EOF
    path.write_bytes(bytes(damaged))
    for _ in range(2):
        with pytest.raises(LogCorrupt) as info:
            await SessionLog.open_for_write(state_dir, "s1", repair=True)
        assert info.value.offset == start
    assert path.read_bytes() == bytes(damaged)


async def _legacy_log(state_dir: Path) -> tuple[Path, bytes]:
    """A log as dshd wrote it before trailers: header frame + one batch, no trailers."""
    c = zstandard.ZstdCompressor(level=3, write_checksum=True)
    session_dir = state_dir / "sessions" / "s1"
    session_dir.mkdir(parents=True)
    lines = [encode_line(make_header())]
    lines.append(b'{"seq":0,"time":1,"type":"turn/start","data":{"turnId":"t0"}}\n')
    old = b"".join(c.compress(line) for line in lines)
    (session_dir / "session.v1.jsonl.zst").write_bytes(old)
    return session_dir, old


async def test_a_log_written_before_trailers_reads_and_gets_them_on_new_frames(state_dir):
    session_dir, old = await _legacy_log(state_dir)
    path = session_dir / "session.v1.jsonl.zst"
    read = read_log(session_dir, "s1")
    assert not read.trailers and len(read.events) == 1 and not read.torn
    log = await SessionLog.open_for_write(state_dir, "s1")
    for batch in (turn_events(1, 1), _call_pair("c1", "hello\n" * 20)):
        for type_, data in batch:
            log.append(type_, data)
        await log.flush()
    await log.aclose()
    data = path.read_bytes()
    assert data.startswith(old)
    after = read_log(session_dir, "s1")
    assert after.trailers and not after.torn and len(after.events) == 4
    # A cut at every byte after the old frames is torn, except at a frame's or trailer's end
    # (the first appended frame without its trailer reads as an old log's frame: kept whole).
    ends, pos = set(), 0
    while pos < len(data):
        pos = scan_zstd_frame(data, pos).end
        ends.add(pos)
    for cut in range(len(old) + 1, len(data)):
        path.write_bytes(data[:cut])
        torn = read_log(session_dir, "s1")
        assert torn.events == after.events[: len(torn.events)], cut
        assert torn.torn or cut in ends, cut
    # Two-bit flips of the last appended frame's headers: refused or identical, as for new logs.
    full = after.events
    start, end = _last_data_frame(data)
    bits = range(start * 8, end * 8)
    for flips in itertools.combinations(bits, 2):
        _judge(data, flips, path, full)


async def test_new_logs_carry_trailers(state_dir):
    path = await _repro_log(state_dir)
    assert read_log(path.parent, "s1").trailers
