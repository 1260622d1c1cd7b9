"""OutputCapture and catch_up from a log (EXEC.md §2; HOST.md §2).

The reference model below is written from the spec's definitions, independently of the
implementation: decode the whole stream at once, delete the C0 controls, and take the longest
suffix (tail) or prefix (head) within both limits by brute force.
"""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from dshd.execution.capture import Gap, OutputCapture, ShellOutputLimits, catch_up

DEFAULT = ShellOutputLimits()


# -- reference model ---------------------------------------------------------------------


def ref_clean(text: str) -> str:
    return "".join(c for c in text if not (ord(c) < 0x20 and c not in "\t\n\x1b"))


def ref_lines(text: str) -> int:
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def ref_fits(text: str, limits: ShellOutputLimits) -> bool:
    return len(text.encode()) <= limits.max_bytes and ref_lines(text) <= limits.max_lines


def ref_window(text: str, limits: ShellOutputLimits) -> tuple[str, bool, str | None]:
    """(window, truncated, truncatedBy) of the whole cleaned text, by the definitions.

    Both limits are monotone (a suffix/prefix of something that fits fits), so the longest
    fitting suffix/prefix is found by bisection over its length.
    """
    tail = limits.retain == "tail"

    def part(n: int) -> str:
        return text[len(text) - n :] if tail else text[:n]

    lo, hi = 0, len(text)  # part(lo) fits; find the largest n that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ref_fits(part(mid), limits):
            lo = mid
        else:
            hi = mid - 1
    if lo == len(text):
        return text, False, None
    by = "lines" if ref_lines(part(lo + 1)) > limits.max_lines else "bytes"
    return part(lo), True, by


def ref_total_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def feed_all(capture: OutputCapture, chunks: list[bytes]) -> None:
    """Feed ``chunks`` and set the totals as the host would report them."""
    stream = b""
    for chunk in chunks:
        capture.feed(chunk)
        stream += chunk
        capture.set_totals(len(stream), ref_total_lines(stream))
    capture.finish()


class MemoryLog:
    """The host's log in memory, read as ``dshd.callhost.log.read`` reads it: bytes from an
    absolute offset, fewer at the end, ``Gap`` before ``first``; it counts what was read."""

    def __init__(self, data: bytes = b"", first: int = 0) -> None:
        self.data, self.first, self.bytes_read = data, first, 0

    async def read(self, offset: int, limit: int) -> bytes:
        if offset < self.first:
            raise Gap(self.first)
        out = self.data[offset:offset + limit]
        self.bytes_read += len(out)
        return out

    def catch_up(self, capture: OutputCapture, end: int | None = None, **kw) -> None:
        end = len(self.data) if end is None else end
        trio.run(lambda: catch_up(capture, self.read, end, self.first,
                                  ref_total_lines(self.data[:end]), **kw))


# -- limits ------------------------------------------------------------------------------


def test_line_limit_keeps_the_last_2000_lines() -> None:
    capture = OutputCapture(DEFAULT, None)
    feed_all(capture, [f"line {i}\n".encode() for i in range(3000)])
    lines = capture.text.splitlines()
    assert len(lines) == 2000
    assert lines[0] == "line 1000" and lines[-1] == "line 2999"
    assert capture.truncation == {
        "truncated": True,
        "truncatedBy": "lines",
        "totalBytes": sum(len(f"line {i}\n") for i in range(3000)),
        "totalLines": 3000,
        "maxBytes": 51_200,
        "maxLines": 2_000,
    }


def test_byte_limit_keeps_the_last_bytes_and_says_bytes() -> None:
    capture = OutputCapture(DEFAULT, None)
    capture.feed(b"x" * 40_000 + b"\n" + b"y" * 40_000 + b"\n")
    capture.finish()
    assert len(capture.text.encode()) == 51_200
    assert capture.text.endswith("y" * 40_000 + "\n")
    assert capture.truncation["truncatedBy"] == "bytes"


def test_single_200kb_line_keeps_its_utf8_safe_end() -> None:
    capture = OutputCapture(DEFAULT, None)
    line = "€" * 70_000  # 3 bytes each: 210,000 bytes, and 51,200 is not a multiple of 3
    data = line.encode()
    # chunk edges fall inside characters
    feed_all(capture, [data[i : i + 4096] for i in range(0, len(data), 4096)])
    assert capture.text == "€" * (51_200 // 3)
    assert capture.truncation["truncatedBy"] == "bytes"
    assert capture.truncation["totalLines"] == 1
    assert capture.truncation["totalBytes"] == 210_000


def test_head_keeps_the_beginning_and_ignores_the_rest() -> None:
    capture = OutputCapture(ShellOutputLimits(max_bytes=100, max_lines=3, retain="head"), None)
    feed_all(capture, [b"one\ntwo\nthree\nfour\n", b"five\n"])
    assert capture.text == "one\ntwo\nthree\n"
    assert capture.truncation["truncatedBy"] == "lines"
    assert capture.truncation["totalLines"] == 5


# -- decoding and cleaning ---------------------------------------------------------------


def test_emoji_split_across_feeds_stays_whole() -> None:
    capture = OutputCapture(DEFAULT, None)
    for byte in "a😀b".encode():
        capture.feed(bytes([byte]))
    assert capture.text == "a😀b"
    assert capture.statistics()["decoderPending"] == 0


def test_invalid_bytes_become_replacement_characters() -> None:
    capture = OutputCapture(DEFAULT, None)
    capture.feed(b"a\xffb\xc3(")
    capture.feed(b"x\xe2\x82")  # ends inside a character: held back until finish
    assert capture.text == "a\ufffdb\ufffd(x"
    capture.finish()
    assert capture.text == "a\ufffdb\ufffd(x\ufffd"


def test_nul_and_c0_controls_dropped_but_counted(tmp_path: Path) -> None:
    capture = OutputCapture(ShellOutputLimits(max_bytes=16, max_lines=100),
                            tmp_path / "output.raw")
    raw = b"a\x00b\x07c\r\n\td\x1b[0m\x7f" + b"\x01" * 40 + b"end"
    feed_all(capture, [raw[:5], raw[5:]])
    assert capture.text == "abc\n\td\x1b[0m\x7fend"
    assert capture.truncation["truncated"] is False
    assert capture.truncation["totalBytes"] == len(raw)
    assert capture.spill_path == str(tmp_path / "output.raw")  # more raw bytes than the window


def test_version_bumps_on_every_change_and_tool_output_shape(tmp_path: Path) -> None:
    capture = OutputCapture(ShellOutputLimits(max_bytes=8, max_lines=10), tmp_path / "s.log")
    versions = [capture.version]
    capture.feed(b"abc")
    capture.set_totals(3, 1)
    versions.append(capture.version)
    capture.feed(b"")  # nothing happened
    versions.append(capture.version)
    assert capture.tool_output() == {
        "content": [{"type": "text", "text": "abc"}],
        "details": {},
        "truncation": {
            "truncated": False,
            "truncatedBy": None,
            "totalBytes": 3,
            "totalLines": 1,
            "maxBytes": 8,
            "maxLines": 10,
        },
    }
    capture.feed(b"defghij")
    versions.append(capture.version)
    capture.finish()
    versions.append(capture.version)
    assert versions == [0, 2, 2, 3, 4]
    out = capture.tool_output()
    assert out["content"][0]["text"] == "cdefghij"
    assert out["details"] == {"spillPath": str(tmp_path / "s.log")}
    assert capture.offset == 2
    with pytest.raises(RuntimeError):
        capture.feed(b"more")


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        OutputCapture(ShellOutputLimits(max_bytes=3), None)
    with pytest.raises(ValueError):
        OutputCapture(ShellOutputLimits(max_lines=0), None)


# -- spill path and the log -------------------------------------------------------------------


def test_no_spill_path_while_output_fits(tmp_path: Path) -> None:
    capture = OutputCapture(DEFAULT, tmp_path / "output.raw")
    feed_all(capture, [b"y\n" * 1000])
    assert capture.spill_path is None
    assert "spillPath" not in capture.tool_output()["details"]


def test_spill_path_when_replacement_characters_overflow_the_window(tmp_path: Path) -> None:
    capture = OutputCapture(ShellOutputLimits(max_bytes=30, max_lines=10), tmp_path / "output.raw")
    feed_all(capture, [b"\xff" * 20])  # 20 raw bytes, 60 bytes of U+FFFD
    assert capture.truncation["truncated"] is True
    assert capture.text == "\ufffd" * 10
    assert capture.spill_path == str(tmp_path / "output.raw")


def test_spill_path_when_totals_pass_the_window_and_is_absolute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    capture = OutputCapture(ShellOutputLimits(max_bytes=1024, max_lines=2), Path("s") / "output.raw")
    capture.set_totals(3, 3)  # three lines: the window (2 lines) is exceeded
    assert capture.spill_path == str(tmp_path / "s" / "output.raw")


def test_dropped_bytes_only_when_the_log_dropped_some() -> None:
    log = MemoryLog(b"x" * 100 + b"tail\n")
    capture = OutputCapture(DEFAULT, None)
    log.catch_up(capture)
    assert "droppedBytes" not in capture.truncation
    log.data += b"more\n"
    log.first = 64
    capture2 = OutputCapture(DEFAULT, None)
    log.catch_up(capture2)
    assert capture2.truncation["droppedBytes"] == 64
    assert capture2.truncation["truncated"] is True  # bytes the window never saw were lost
    assert capture2.text == "x" * 36 + "tail\nmore\n"


def test_a_large_gap_reads_only_the_tail() -> None:
    """The daemon's CPU grows with catch-ups, not bytes: 64 MiB of output behind, a catch-up
    reads a few window sizes of it, and the window is exact."""
    stream = b"".join(b"line %d\n" % i for i in range(8_000_000))[: 64 * 1024 * 1024]
    log = MemoryLog(stream)
    capture = OutputCapture(DEFAULT, None)
    log.catch_up(capture)
    assert log.bytes_read <= 16 * DEFAULT.max_bytes
    reference = OutputCapture(DEFAULT, None)
    feed_all(reference, [stream])
    capture.finish()
    assert (capture.text, capture.truncation) == (reference.text, reference.truncation)


def test_a_jump_grows_backwards_through_cleaned_away_bytes() -> None:
    """A tail of NULs cleans to nothing: the jump reads further back until the cleaned tail
    overflows the window, and the window is still exact."""
    limits = ShellOutputLimits(max_bytes=64, max_lines=4)
    stream = b"".join(b"%d\n" % i for i in range(5000)) + b"\x00" * 10_000 + b"end"
    log = MemoryLog(stream)
    capture = OutputCapture(limits, None)
    log.catch_up(capture, threshold=100)
    capture.finish()
    reference = OutputCapture(limits, None)
    feed_all(reference, [stream])
    assert (capture.text, capture.truncation) == (reference.text, reference.truncation)
    assert capture.text == "4997\n4998\n4999\nend"


def test_head_mode_reads_until_the_window_closed_then_nothing() -> None:
    limits = ShellOutputLimits(max_bytes=64, max_lines=4, retain="head")
    log = MemoryLog(b"a\nb\nc\nd\ne\n" + b"f" * 10_000_000)
    capture = OutputCapture(limits, None)
    log.catch_up(capture)
    assert capture.text == "a\nb\nc\nd\n" and capture.closed
    assert log.bytes_read <= 4 * 1024 * 1024 + 64  # one piece, then closed
    before = log.bytes_read
    log.data += b"g" * 1000
    log.catch_up(capture)
    assert log.bytes_read == before
    assert capture.truncation["totalBytes"] == len(log.data)


def test_capture_memory_is_bounded_by_the_window() -> None:
    capture = OutputCapture(DEFAULT, None)
    chunk = b"y\n" * 32_768
    peak: dict[str, int] = {}
    for _ in range(100):
        capture.feed(chunk)
        for key, value in capture.statistics().items():
            peak[key] = max(peak.get(key, 0), value)
    capture.finish()
    assert peak["windowChars"] <= 51_200
    assert peak["decoderPending"] <= 3


# -- properties ------------------------------------------------------------------------------

PIECES = st.one_of(
    st.text(alphabet="ab \t\n€😀\x00\x07\r\x1bé", max_size=12).map(str.encode),
    st.binary(max_size=6),
    st.sampled_from([b"\n", b"\xf0\x9f\x98\x80", b"\xf0\x9f", b"\xe2\x82", b"\x80", b"\xff", b"\r\n"]),
    st.sampled_from([b"\n" * 40, b"ab\n" * 25, "€\n".encode() * 30]),  # many lines at once
)
LIMITS = st.builds(
    ShellOutputLimits,
    max_bytes=st.one_of(st.integers(4, 48), st.integers(49, 400)),
    max_lines=st.one_of(st.integers(1, 6), st.integers(7, 60)),
    retain=st.sampled_from(["tail", "head"]),
)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), limits=LIMITS)
def test_any_chunking_gives_the_reference_window(data: st.DataObject, limits: ShellOutputLimits) -> None:
    stream = b"".join(data.draw(st.lists(PIECES, max_size=30), label="pieces"))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts"))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]

    capture = OutputCapture(limits, Path("/calls/c/output.raw"))
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    seen, fed = "", b""
    for chunk in chunks:
        capture.feed(chunk)
        fed += chunk
        capture.set_totals(len(fed), ref_total_lines(fed))
        seen += decoder.decode(chunk)
        # At every step: the window of what has been decoded so far.
        assert capture.text == ref_window(ref_clean(seen), limits)[0]
        assert len(capture.text.encode()) <= limits.max_bytes
        assert ref_lines(capture.text) <= limits.max_lines
    capture.finish()

    text, truncated, by = ref_window(ref_clean(stream.decode("utf-8", "replace")), limits)
    assert capture.text == text
    assert capture.truncation == {
        "truncated": truncated,
        "truncatedBy": by,
        "totalBytes": len(stream),
        "totalLines": ref_total_lines(stream),
        "maxBytes": limits.max_bytes,
        "maxLines": limits.max_lines,
    }
    must_spill = truncated or len(stream) > limits.max_bytes or ref_total_lines(stream) > limits.max_lines
    assert capture.spill_path == ("/calls/c/output.raw" if must_spill else None)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), limits=LIMITS)
def test_catch_ups_with_jumps_give_the_window_of_feeding_everything(
        data: st.DataObject, limits: ShellOutputLimits) -> None:
    """For random streams, random catch-up points and random jump thresholds, the window after
    every catch-up equals that of feeding every byte so far (EXEC.md §2's cleaned tail)."""
    stream = b"".join(data.draw(st.lists(PIECES, max_size=40), label="pieces"))
    ends = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="ends"))
    threshold = data.draw(st.integers(0, 120), label="threshold")
    log = MemoryLog(stream)
    capture = OutputCapture(limits, None)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    seen, last = "", 0
    for end in [*ends, len(stream)]:
        log.catch_up(capture, end, threshold=threshold)
        seen += decoder.decode(stream[last:end])
        last = end
        window, truncated, by = ref_window(ref_clean(seen), limits)
        assert capture.text == window
        assert capture.truncation["truncated"] == truncated
        assert capture.truncation["totalBytes"] == end
        if limits.retain == "tail":
            assert capture.truncation["truncatedBy"] == by
    capture.finish()
    whole = OutputCapture(limits, None)
    feed_all(whole, [stream])
    assert (capture.text, capture.truncation) == (whole.text, whole.truncation)
