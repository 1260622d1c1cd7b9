"""The pure v1 format: lines and zstd frame structure (STORAGE.md §2, §3). Sync, hypothesis."""

from __future__ import annotations

from pathlib import Path

import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from dshd.storage import Event
from dshd.storage.format import decode_event, encode_line, scan_zstd_frame
from dshd.storage.reader import parse_log
from storage_helpers import make_header

# Any text Python can encode as UTF-8 (lone surrogates excluded: append refuses them).
texts = st.text(st.characters(blacklist_categories=["Cs"]), max_size=200)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(texts, json_values, max_size=5), texts)
def test_event_lines_round_trip(data, text):
    data = {**data, "text": text}
    ev = Event(seq=7, time=1_700_000_000_000, type="message/user", data=data)
    line = encode_line(ev)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # readers split on \n only
    assert decode_event(line[:-1]) == ev
    assert b'"ignorable"' not in line


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(texts, min_size=1, max_size=5), min_size=0, max_size=6))
def test_frame_boundaries_from_structure(batches):
    header = encode_line(make_header())
    c = zstandard.ZstdCompressor(write_checksum=True)
    frames = [c.compress(header)]
    events = []
    for batch in batches:
        lines = b""
        for text in batch:
            ev = Event(seq=len(events), time=1, type="message/user", data={"text": text})
            events.append(ev)
            lines += encode_line(ev)
        frames.append(c.compress(lines))
    data = b"".join(frames)
    pos = 0
    for frame in frames:
        scan = scan_zstd_frame(data, pos)
        assert scan.kind == "frame" and scan.checksum and scan.end == pos + len(frame)
        pos = scan.end
    read = parse_log(data, session_id="s1", path=Path("x"), compression="zstd")
    assert read.events == events and not read.torn
    plain = header + b"".join(encode_line(e) for e in events)
    assert parse_log(plain, session_id="s1", path=Path("x"), compression="none").events == events


def test_scan_verdicts():
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(b"x" * 1000 + b"\n")
    assert scan_zstd_frame(frame, 0).kind == "frame"
    assert scan_zstd_frame(frame[:2], 0).kind == "torn"
    assert scan_zstd_frame(frame[:-1], 0).kind == "torn"
    assert scan_zstd_frame(b"\0\0\0\0" + frame, 0).kind == "bad"
    skippable = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    assert scan_zstd_frame(skippable + frame, 0)[:3] == ("skippable", 0, len(skippable))
    assert scan_zstd_frame(skippable[:-1], 0).kind == "torn"


def test_skippable_frames_are_skipped():
    c = zstandard.ZstdCompressor(write_checksum=True)
    skippable = (0x184D2A5E).to_bytes(4, "little") + (2).to_bytes(4, "little") + b"hi"
    ev = Event(seq=0, time=1, type="turn/start", data={"turnId": "t"})
    data = c.compress(encode_line(make_header())) + skippable + c.compress(encode_line(ev))
    assert parse_log(data, session_id="s1", path=Path("x"), compression="zstd").events == [ev]
