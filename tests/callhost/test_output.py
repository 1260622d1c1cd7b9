"""Output through the real host: byte-exact log, totals, segments and firstOffset."""

from __future__ import annotations

import hashlib
import os

import pytest

from dshd.callhost import log

SIZES = [0, 1, 4096, 51199, 51200, 51201, 1 << 20]


def _random_file(path, size: int) -> bytes:
    data = bytearray(os.urandom(size))
    for i in range(0, size, 97):  # make sure NUL, CR and invalid UTF-8 are in it
        data[i] = (0, 13, 0xFF, 0xC3)[i % 4]
    path.write_bytes(data)
    return bytes(data)


def _read_all(directory, extent) -> bytes:
    out = bytearray()
    offset = extent.first_offset
    while offset < extent.end_offset:
        chunk = log.read(directory, offset, 4 << 20, extent.segment_bytes)
        assert chunk, f"the reader stalled at {offset}"
        out += chunk
        offset += len(chunk)
    return bytes(out)


@pytest.mark.parametrize("size", SIZES)
def test_output_is_byte_exact(hosts, tmp_path, size):
    data = _random_file(tmp_path / "src", size)
    run = hosts(["/bin/cat", str(tmp_path / "src")])
    record = run.wait_record()
    assert record["reason"] == "exited" and record["exitCode"] == 0, record
    assert run.output() == data
    extent = log.scan(run.dir)
    assert (extent.first_offset, extent.end_offset) == (0, size)
    assert _read_all(run.dir, extent) == data
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    assert (record["totalBytes"], record["totalLines"], record["firstOffset"]) == (size, lines, 0)


def test_100_mib_are_byte_exact(hosts, tmp_path):
    size = 100 << 20
    src = tmp_path / "src"
    with open(src, "wb") as f:
        for _ in range(100):
            f.write(os.urandom(1 << 20))
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    run = hosts(["/bin/cat", str(src)])
    record = run.wait_record(timeout=300)
    assert record["totalBytes"] == size and record["exitCode"] == 0
    got = hashlib.sha256()
    offset = 0
    while offset < size:
        chunk = log.read(run.dir, offset, 4 << 20, run.spec["segment_bytes"])
        assert chunk
        got.update(chunk)
        offset += len(chunk)
    assert got.hexdigest() == want


def test_segments_bound_the_disk_and_the_reader_reports_the_gap(hosts, tmp_path):
    data = _random_file(tmp_path / "src", 200_000)
    run = hosts(["/bin/cat", str(tmp_path / "src")], spill_max_bytes=16384,
                segment_bytes=4096)
    record = run.wait_record()
    segments = [p for p in run.dir.iterdir() if p.name.startswith("output.raw")]
    assert len(segments) <= 4
    assert sum(p.stat().st_size for p in segments) <= 16384
    extent = log.scan(run.dir)
    assert extent.end_offset == len(data) == record["totalBytes"]
    assert extent.first_offset == record["firstOffset"] > 0
    assert extent.first_offset % 4096 == 0 and len(data) - extent.first_offset <= 16384
    assert _read_all(run.dir, extent) == data[extent.first_offset:]
    with pytest.raises(log.Gap) as info:
        log.read(run.dir, extent.first_offset - 1, 10, extent.segment_bytes)
    assert info.value.first_offset == extent.first_offset
    with pytest.raises(log.Gap):
        log.read(run.dir, 0, 10, extent.segment_bytes)
