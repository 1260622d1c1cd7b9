"""Torn or damaged (STORAGE.md §5, issue 10 item 9): a frame that ends at EOF is a torn tail
only when its bytes are a prefix of a valid frame. A flipped bit in the last, complete frame
-- its frame header, a block header, a payload byte, its checksum -- is damage: the reader
refuses (and never changes the file) instead of dropping a durable ``tool/result`` as a torn
tail. Real truncations at every offset stay torn (test_storage_recovery.py)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from dshd.storage import StorageError
from dshd.storage.format import scan_zstd_frame
from dshd.storage.reader import parse_log
from storage_helpers import turn_events, write_log


def _call_pair(call_id: str, text: str) -> list[tuple[str, dict]]:
    return [
        ("tool/call", {"callId": call_id, "name": "bash", "arguments": '{"command":"echo"}'}),
        ("tool/result", {"callId": call_id, "isError": False, "exitCode": 0, "content": text,
                         "details": {"truncation": {"totalBytes": len(text)}}}),
    ]


def _verdict(data: bytes, path: Path, compression: str):
    try:
        return parse_log(data, session_id="s1", path=path, compression=compression)
    except StorageError as exc:
        return exc


def _check_flip(data: bytes, bit: int, path: Path, compression: str, full: list) -> str:
    damaged = bytearray(data)
    damaged[bit // 8] ^= 1 << (bit % 8)
    read = _verdict(bytes(damaged), path, compression)
    if isinstance(read, StorageError):
        return "refused"
    lost = [e for e in full if e not in read.events]
    assert not lost, (f"bit {bit} (byte {bit // 8}) dropped durable records silently: torn="
                      f"{read.torn}, kept {len(read.events)} of {len(full)}")
    if read.torn:
        return "torn"
    assert read.events == full, f"bit {bit}: records changed without the checksum noticing"
    return "identical"


def _last_frame(data: bytes) -> tuple[int, list[int]]:
    """Start of the last data frame (its trailer follows it), and [start, *pieces]."""
    pos, start = 0, 0
    while pos < len(data):
        scan = scan_zstd_frame(data, pos)
        if scan.kind == "frame":
            start = pos
        pos = scan.end
    return start, [start, *scan_zstd_frame(data, start).pieces]


async def test_every_bit_of_the_last_zstd_frame(state_dir):
    path = await write_log(state_dir, [turn_events(2), _call_pair("c1", "hello\n" * 20)])
    data = path.read_bytes()
    full = parse_log(data, session_id="s1", path=path, compression="zstd").events
    start, _ = _last_frame(data)
    outcomes: dict[str, int] = {}
    for bit in range(start * 8, len(data) * 8):
        outcome = _check_flip(data, bit, path, "zstd", full)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # Nothing reads as torn. A few flips are harmless: the descriptor's unused bit, and bits of
    # the compressed payload the decoder never uses (same output, the checksum agrees).
    assert outcomes.get("torn", 0) == 0, outcomes
    assert outcomes["refused"] > 50 * outcomes.get("identical", 0), outcomes


async def test_header_and_block_header_bits_of_a_multi_block_last_frame(state_dir):
    big = [("message/user", {"text": secrets.token_hex(60)}) for _ in range(2500)]
    path = await write_log(state_dir, [turn_events(2), big + _call_pair("c1", "done\n")])
    data = path.read_bytes()
    full = parse_log(data, session_id="s1", path=path, compression="zstd").events
    start, pieces = _last_frame(data)
    assert len(pieces) >= 4  # frame start, header end, at least two blocks
    bits = set(range(start * 8, (start + 14) * 8))  # magic + the largest frame header
    for block in pieces[1:-1]:  # every block header
        bits |= set(range(block * 8, (block + 3) * 8))
    frame_end = pieces[-1]
    bits |= set(range((frame_end - 4) * 8, frame_end * 8))  # the frame's checksum
    bits |= set(range(start * 8, frame_end * 8, 977))  # a sample of the payload
    outcomes: dict[str, int] = {}
    for bit in sorted(bits):
        outcome = _check_flip(data, bit, path, "zstd", full)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("torn", 0) == 0, outcomes
    # The trailer after it (16 bytes): a flip is damage, except one that leaves the trailer a
    # prefix followed by zero bytes, which is what power loss leaves (STORAGE.md §5: zeros at
    # EOF are judged by the bytes before them) -- then torn, with every record kept
    # (_check_flip asserts nothing was dropped).
    for bit in range(frame_end * 8, len(data) * 8):
        outcome = _check_flip(data, bit, path, "zstd", full)
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        zeroed_tail = not damaged[bit // 8:].strip(b"\0")
        assert outcome == "refused" or (outcome == "torn" and zeroed_tail), (bit, outcome)


async def test_every_bit_of_the_last_plain_line(state_dir):
    """Plain logs carry no checksum: a flip inside a value can go unseen (STORAGE.md §5 says
    so), but a complete last record is never dropped as a torn tail."""
    path = await write_log(state_dir, [turn_events(2), _call_pair("c1", "hello\n")],
                           compression="none")
    data = path.read_bytes()
    full = parse_log(data, session_id="s1", path=path, compression="none").events
    start = data.rindex(b"\n", 0, len(data) - 1) + 1
    outcomes: dict[str, int] = {}
    for bit in range(start * 8, len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        read = _verdict(bytes(damaged), path, "none")
        if isinstance(read, StorageError):
            outcome = "refused"
        else:
            assert len(read.events) == len(full), f"bit {bit}: the last record was dropped"
            assert read.events[-1].type == "tool/result" and not read.torn, bit
            outcome = "identical" if read.events == full else "changed value"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes["refused"] > 0


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_zero_filled_tail_after_a_cut_is_still_torn(state_dir, compression):
    """Power loss can leave the file longer than what reached it (zeros): still torn."""
    path = await write_log(state_dir, [turn_events(2), _call_pair("c1", "x" * 300)],
                           compression=compression)
    data = path.read_bytes()
    full = parse_log(data, session_id="s1", path=path, compression=compression).events
    cut = len(data) - 40
    read = parse_log(data[:cut] + b"\0" * 4096, session_id="s1", path=path,
                     compression=compression)
    assert read.torn and read.events == full[: len(read.events)] and len(read.events) >= 2
