"""OutputCapture and SpillSink, pure and synchronous (EXEC.md §2).

The reference model below is written from the spec's definitions, independently of the
implementation: decode the whole stream at once, delete the C0 controls, and take the longest
suffix (tail) or prefix (head) within both limits by brute force.
"""

from __future__ import annotations

import codecs
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dshd.execution.capture import OutputCapture, ShellOutputLimits, SpillSink

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
    for chunk in chunks:
        capture.feed(chunk)
        if capture.spill is not None:
            capture.spill.flush_sync()
    capture.finish()
    if capture.spill is not None:
        capture.spill.flush_sync()


# -- limits ------------------------------------------------------------------------------


def test_line_limit_keeps_the_last_2000_lines() -> None:
    capture = OutputCapture(DEFAULT, None)
    for i in range(3000):
        capture.feed(f"line {i}\n".encode())
    capture.finish()
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
    for i in range(0, len(data), 4096):  # chunk edges fall inside characters
        capture.feed(data[i : i + 4096])
    capture.finish()
    assert capture.text == "€" * (51_200 // 3)
    assert capture.truncation["truncatedBy"] == "bytes"
    assert capture.truncation["totalLines"] == 1
    assert capture.truncation["totalBytes"] == 210_000


def test_head_keeps_the_beginning_and_ignores_the_rest() -> None:
    capture = OutputCapture(ShellOutputLimits(max_bytes=100, max_lines=3, retain="head"), None)
    capture.feed(b"one\ntwo\nthree\nfour\n")
    capture.feed(b"five\n")
    capture.finish()
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


def test_nul_and_c0_controls_dropped_but_kept_in_the_spill(tmp_path: Path) -> None:
    sink = SpillSink.for_call(tmp_path, "call-1")
    capture = OutputCapture(ShellOutputLimits(max_bytes=16, max_lines=100), sink)
    raw = b"a\x00b\x07c\r\n\td\x1b[0m\x7f" + b"\x01" * 40 + b"end"
    feed_all(capture, [raw[:5], raw[5:]])
    assert capture.text == "abc\n\td\x1b[0m\x7fend"
    assert capture.truncation["truncated"] is False
    assert capture.truncation["totalBytes"] == len(raw)
    assert capture.spill_path == str(tmp_path / "spill" / "call-1.log")
    assert Path(capture.spill_path).read_bytes() == raw


def test_final_line_without_newline_is_counted() -> None:
    for data, lines in [(b"", 0), (b"a", 1), (b"a\n", 1), (b"a\nb", 2), (b"\n\n", 2), (b"\x00", 1)]:
        capture = OutputCapture(DEFAULT, None)
        capture.feed(data)
        capture.finish()
        assert capture.truncation["totalLines"] == lines, data


def test_version_bumps_on_every_change_and_tool_output_shape(tmp_path: Path) -> None:
    capture = OutputCapture(ShellOutputLimits(max_bytes=8, max_lines=10), SpillSink(tmp_path / "s.log"))
    versions = [capture.version]
    capture.feed(b"abc")
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
    assert versions == [0, 1, 1, 2, 3]
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


# -- spill ---------------------------------------------------------------------------------


def test_no_spill_while_output_fits(tmp_path: Path) -> None:
    sink = SpillSink.for_call(tmp_path, "c")
    capture = OutputCapture(DEFAULT, sink)
    feed_all(capture, [b"y\n" * 1000])
    assert capture.spill_path is None
    assert "spillPath" not in capture.tool_output()["details"]
    assert not (tmp_path / "spill").exists()
    assert capture.statistics()["rawBuffered"] == 0  # dropped at finish


def test_spill_starts_when_replacement_characters_overflow_the_window(tmp_path: Path) -> None:
    sink = SpillSink.for_call(tmp_path, "c")
    capture = OutputCapture(ShellOutputLimits(max_bytes=30, max_lines=10), sink)
    raw = b"\xff" * 20  # 20 raw bytes, 60 bytes of U+FFFD
    feed_all(capture, [raw])
    assert capture.truncation["truncated"] is True
    assert capture.text == "\ufffd" * 10
    assert Path(capture.spill_path).read_bytes() == raw


def test_spill_file_and_directory_modes(tmp_path: Path) -> None:
    sink = SpillSink.for_call(tmp_path, "call_2")
    capture = OutputCapture(ShellOutputLimits(max_bytes=4, max_lines=1), sink)
    feed_all(capture, [b"hello\nworld\n"])
    assert stat.S_IMODE(os.stat(tmp_path / "spill").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(capture.spill_path).st_mode) == 0o600
    assert sink.written == 12


def test_spill_rejects_bad_call_ids(tmp_path: Path) -> None:
    for bad in ["../x", "a/b", "", "__proto__", "x" * 65]:
        with pytest.raises(ValueError):
            SpillSink.for_call(tmp_path, bad)


def test_spill_write_failure_is_reported_and_sticky(tmp_path: Path) -> None:
    (tmp_path / "spill").write_text("a file where the directory should be")
    sink = SpillSink.for_call(tmp_path, "c")
    sink.write(b"data")
    with pytest.raises(OSError):
        sink.flush_sync()
    assert isinstance(sink.error, OSError)
    sink.write(b"more")
    assert sink.pending == 0
    sink.flush_sync()  # a no-op now: the caller already knows
    sink.close()


def test_capture_memory_is_bounded_by_the_window(tmp_path: Path) -> None:
    sink = SpillSink.for_call(tmp_path, "c")
    capture = OutputCapture(DEFAULT, sink)
    chunk = b"y\n" * 32_768
    peak: dict[str, int] = {}
    for _ in range(100):
        capture.feed(chunk)
        for key, value in capture.statistics().items():
            peak[key] = max(peak.get(key, 0), value)
        sink.flush_sync()
    capture.finish()
    sink.flush_sync()
    assert peak["windowChars"] <= 51_200
    assert peak["rawBuffered"] <= 51_200 + len(chunk)
    assert peak["spillPending"] <= 51_200 + 2 * len(chunk)
    assert os.path.getsize(capture.spill_path) == 100 * len(chunk)


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

    with tempfile.TemporaryDirectory() as tmp:
        capture = OutputCapture(limits, SpillSink(Path(tmp) / "spill" / "c.log"))
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        seen = ""
        for chunk in chunks:
            capture.feed(chunk)
            capture.spill.flush_sync()
            seen += decoder.decode(chunk)
            # At every step: the window of what has been decoded so far.
            assert capture.text == ref_window(ref_clean(seen), limits)[0]
            assert len(capture.text.encode()) <= limits.max_bytes
            assert ref_lines(capture.text) <= limits.max_lines
        capture.finish()
        capture.spill.flush_sync()

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

        whole = OutputCapture(limits, None)
        whole.feed(stream)
        whole.finish()
        assert (whole.text, whole.truncation) == (capture.text, capture.truncation)

        must_spill = truncated or len(stream) > limits.max_bytes or ref_total_lines(stream) > limits.max_lines
        if must_spill:
            assert Path(capture.spill_path).read_bytes() == stream
        else:
            assert capture.spill_path is None
        capture.spill.close()


def test_spill_path_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert SpillSink(Path("session") / "spill" / "c.log").path == str(tmp_path / "session" / "spill" / "c.log")
