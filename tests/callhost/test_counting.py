"""The host's line counting and chunking (issue 14): exact totals and a byte-exact log for any
chunking of any output, in the log writer alone (hypothesis) and through the real host.

``totalLines`` is defined (EXEC.md §2) as the number of ``\\n`` bytes plus one for a final line
without one; the log must hold every byte in order. The writer counts each appended chunk by
one of two methods picked on a 4 KiB sample (:func:`dshd.callhost.log.count_newlines`), so the
strategies below build chunks past its 64 KiB threshold whose sample disagrees with the rest
(sparse head, dense tail and the reverse), beside CRLF, ``\\r`` progress, UTF-8 split across
writes, NUL and arbitrary binary.
"""

from __future__ import annotations

import json
import os
import sys

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dshd.callhost import log

from .test_output import _read_all

TTY = {"cols": 80, "rows": 24, "term": "xterm"}


def ref_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


#: Small pieces of what commands write: lines, CRLF, a progress meter, UTF-8 (whole and cut),
#: controls, invalid UTF-8.
PIECES = st.sampled_from([
    b"\n", b"\r\n", b"\r", b"line of output\n", b"\r 42% [=====>    ]", b"\x1b[01;35mwarn\x1b[m",
    "‘quoted’ é → ✓\n".encode(), "é".encode()[:1], "✓".encode()[1:], b"\x00", b"\xff\xfe",
    b"x" * 76 + b"\n", b"1234567\n",
])


@st.composite
def chunks(draw) -> bytes:
    """A chunk: a few pieces and random bytes, or a big one (>= 64 KiB) whose first 4 KiB have
    another newline density than the rest."""
    if draw(st.booleans()):
        parts = draw(st.lists(st.one_of(PIECES, st.binary(max_size=64)), max_size=12))
        return b"".join(parts)
    head_unit = draw(st.sampled_from([b"x" * 200 + b"\n", b"\n\n", b"ab\n", bytes(100)]))
    tail_unit = draw(st.sampled_from([b"1234567\n", b"x" * 76 + b"\n", bytes(64), b"\r\n"]))
    head = (head_unit * (4096 // len(head_unit) + 1))[:draw(st.integers(0, 4096))]
    size = draw(st.integers(65536, 200_000))
    tail = tail_unit * ((size - len(head)) // len(tail_unit) + 1)
    return (head + tail)[:size]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(chunks(), max_size=8),
       segment_bytes=st.sampled_from([4093, 65536, 100_000, 1 << 28]))
@example(parts=[b"\n" * 70000, b"no newline at the end"], segment_bytes=65536)
@example(parts=[b"x" * 5000 + b"\n" * 70000], segment_bytes=1 << 28)
def test_any_chunking_keeps_exact_totals_and_bytes(tmp_path_factory, parts, segment_bytes):
    directory = tmp_path_factory.mktemp("log")
    (directory / "host.json").write_text(json.dumps({"segmentBytes": segment_bytes}))
    writer = log.LogWriter(str(directory), segment_bytes)
    for part in parts:
        writer.append(part)
    writer.close()
    data = b"".join(parts)
    assert (writer.total_bytes, writer.total_lines) == (len(data), ref_lines(data))
    extent = log.scan(directory)
    assert extent.end_offset == len(data)
    assert _read_all(directory, extent) == data[extent.first_offset:]  # <= 4 segments kept


@settings(max_examples=200, deadline=None)
@given(chunk=chunks())
@example(chunk=b"x" * 70000 + b"\n")  # sparse sample, the chunk's last byte a newline
@example(chunk=bytes(4096) + b"\n" * 70000)  # sparse sample, dense rest
def test_count_newlines_is_bytes_count_for_any_chunk(chunk):
    assert log.count_newlines(chunk) == chunk.count(b"\n")


# -- through the real host ---------------------------------------------------------------

#: A producer writing the pieces given as JSON (latin-1 strings) in a file, one write(2) each,
#: with the pause after each piece: what a command's writes look like to the host.
PRODUCER = """
import json, os, sys, time
for text, pause in json.load(open(sys.argv[1])):
    os.write(1, text.encode("latin-1"))
    if pause:
        time.sleep(pause)
"""


def _produce(hosts, tmp_path, pieces: list[tuple[bytes, float]], **spec):
    script = tmp_path / "pieces.json"
    script.write_text(json.dumps([(p.decode("latin-1"), s) for p, s in pieces]))
    run = hosts([sys.executable, "-I", "-S", "-c", PRODUCER, str(script)], **spec)
    return run, run.wait_record()


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.tuples(st.one_of(chunks(), PIECES),
                                 st.sampled_from([0.0, 0.0, 0.001, 0.01])), max_size=10))
@example(pieces=[("é✓".encode()[:3], 0.01), ("é✓".encode()[3:] + b"\r\n", 0.0)])
def test_the_real_host_logs_every_write_exactly(hosts, tmp_path_factory, pieces):
    tmp_path = tmp_path_factory.mktemp("run")
    run, record = _produce(hosts, tmp_path, pieces)
    data = b"".join(p for p, _ in pieces)
    assert record["exitCode"] == 0, (run.dir / "host.log").read_text()
    assert run.output() == data
    assert (record["totalBytes"], record["totalLines"]) == (len(data), ref_lines(data))


def test_a_huge_dense_flood_keeps_exact_totals(hosts):
    """~76 MiB of `seq` (a newline every 8 bytes: the count's slow case, in reads of up to
    1 MiB) and a last line without a newline."""
    n = 10_000_000
    run = hosts(["/bin/sh", "-c", f"seq 1 {n}; printf 'the end'"])
    record = run.wait_record(timeout=300)
    size = sum(9 * 10 ** (d - 1) * (d + 1) for d in range(1, 8)) + len("10000000\n") + 7
    assert record["exitCode"] == 0
    assert (record["totalBytes"], record["totalLines"]) == (size, n + 1)
    tail = log.read(run.dir, size - 24, 24, run.spec["segment_bytes"])
    assert tail == b"9999998\n9999999\n10000000\nthe end"[-24:]


def test_pty_output_totals_count_what_the_terminal_delivered(hosts, tmp_path):
    """A PTY turns "\\n" into "\\r\\n" (onlcr): the log holds what the master read and the
    totals are the log's, with UTF-8 split across writes and a `\\r` progress meter."""
    noise = bytes(b for b in os.urandom(4000) if b not in b"\x03\x04\x1a\x1c\n\r")[:3000]
    pieces = [("50% ".encode(), 0.0), (b"\r100%\n", 0.01), ("é✓".encode()[:3], 0.01),
              ("é✓".encode()[3:] + b"\n" * 3, 0.0), (noise, 0.0), (b"\nlast", 0.0)]
    run, record = _produce(hosts, tmp_path, pieces, tty=TTY)
    data = run.output()
    assert record["exitCode"] == 0, (run.dir / "host.log").read_text()
    assert (record["totalBytes"], record["totalLines"]) == (len(data), ref_lines(data))
    assert data.startswith("50% \r100%\r\né✓\r\n\r\n\r\n".encode()), data[:40]
    assert data.endswith(b"\r\nlast")
