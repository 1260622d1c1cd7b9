"""The segmented log on its own: writer and reader (plan §A), no host process."""

from __future__ import annotations

import json
import os

import pytest

from dshd.callhost import log


def _host_json(directory, segment_bytes: int) -> None:
    (directory / "host.json").write_text(json.dumps({"segmentBytes": segment_bytes}))


def test_segments_keep_at_most_four_and_reads_cross_them(tmp_path):
    _host_json(tmp_path, 100)
    writer = log.LogWriter(str(tmp_path), 100)
    data = os.urandom(1234)
    for i in range(0, len(data), 77):
        writer.append(data[i:i + 77])
    writer.close()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("output.raw"))
    assert names == ["output.raw.10", "output.raw.11", "output.raw.12", "output.raw.9"]
    extent = log.scan(tmp_path)
    assert extent == log.LogExtent(900, 1234, 100)
    assert writer.first_offset == 900 and writer.total_bytes == 1234
    assert sum((tmp_path / n).stat().st_size for n in names) <= 400
    assert log.read(tmp_path, 900, 10_000, 100) == data[900:]
    assert log.read(tmp_path, 950, 120, 100) == data[950:1070]
    assert log.read(tmp_path, 1234, 10, 100) == b""
    with pytest.raises(log.Gap) as info:
        log.read(tmp_path, 899, 10, 100)
    assert info.value.first_offset == 900


def test_lines_count_a_final_line_without_newline(tmp_path):
    writer = log.LogWriter(str(tmp_path), 1 << 20)
    assert writer.total_lines == 0
    writer.append(b"a\nb")
    assert writer.total_lines == 2
    writer.append(b"\n")
    assert writer.total_lines == 2
    writer.append(b"\r\n\n")
    assert writer.total_lines == 4
    writer.close()


def test_a_log_from_before_the_host_is_one_file(tmp_path):
    (tmp_path / "output.raw").write_bytes(b"0123456789")
    assert log.scan(tmp_path) == log.LogExtent(0, 10, 0)
    assert log.read(tmp_path, 3, 4, 0) == b"3456"


def test_an_existing_log_is_refused(tmp_path):
    (tmp_path / "output.raw").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        log.LogWriter(str(tmp_path), 4096)


@pytest.mark.parametrize("kind", ["none", "sparse", "dense", "sparse-head-dense-tail", "random"])
def test_count_newlines_equals_bytes_count(kind):
    size = 1 << 20
    data = {"none": bytes(size), "sparse": (b"x" * 76 + b"\n") * (size // 77),
            "dense": (b"1234567\n" * (size // 8)),
            "sparse-head-dense-tail": bytes(8192) + b"\n\n" * size,
            "random": os.urandom(size)}[kind]
    for cut in (0, 1, 4095, 65535, 65536, len(data)):
        assert log.count_newlines(data[:cut]) == data[:cut].count(b"\n")
