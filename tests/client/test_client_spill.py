"""Complete output through the spill file (``client.spill.CompleteOutput``).

The property tests drive the daemon's own pieces -- ``OutputCapture`` (window, totals, the
spill it starts), ``Tracker`` + ``Encoder`` (the lane's diffs) -- into the client's ``Mirror``
and ``CompleteOutput``, in any interleaving of writes (split anywhere, even inside a UTF-8
character), lane flushes, resubscribes, spill flushes that lag the lane, and the client's
takes: whatever the client missed in the lane, the bytes it prints are always a prefix of what
the command wrote, and in the end all of it.
"""

from __future__ import annotations

import codecs
import os

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from protocol.mirror import Mirror
from client.spill import (CompleteOutput, SpillFile, cleaned, incomplete_utf8_tail)
from dshd.execution.capture import OutputCapture, ShellOutputLimits
from protocol.codec import Encoder
from protocol.lane import ToolResult
from protocol.tracker import Tracker

CID = "c1"
BASE = ["tools", CID, "output"]
SPILL_PATH = "/nowhere/spill/c1.log"


class FakeSink:
    """The call's log as a reader sees it; ``flush(n)`` makes ``n`` more bytes visible in the
    "file" (the file may lag the capture's view: the client polls it)."""

    path = SPILL_PATH

    def __init__(self) -> None:
        self.buffered = bytearray()
        self.file: bytearray | None = None  # None: not created yet

    @property
    def pending(self) -> int:
        return len(self.buffered)

    def write(self, data: bytes) -> None:
        self.buffered += data

    def flush(self, n: int | None = None) -> None:
        if not self.buffered:
            return
        n = len(self.buffered) if n is None else min(n, len(self.buffered))
        if self.file is None:
            self.file = bytearray()
        self.file += self.buffered[:n]
        del self.buffered[:n]


class FakeSpill:
    """What ``CompleteOutput`` reads: the sink's visible file."""

    def __init__(self, sink: FakeSink, broken: list[bool]) -> None:
        self.sink = sink
        self.broken = broken

    def size(self) -> int | None:
        if self.broken[0]:
            raise OSError(5, "Input/output error")
        return None if self.sink.file is None else len(self.sink.file)

    def read(self, offset: int, n: int) -> bytes:
        if self.broken[0]:
            raise OSError(5, "Input/output error")
        assert self.sink.file is not None
        return bytes(self.sink.file[offset:offset + n])

    def close(self) -> None:
        pass


def _lane() -> dict:
    return {"session": {}, "tools": {}, "approvals": {}, "recent": [], "turn": None}


class Daemon:
    """One call's capture published into a lane, like dshd's session does."""

    def __init__(self, limits: ShellOutputLimits) -> None:
        self.sink = FakeSink()
        self.cap = OutputCapture(limits, SPILL_PATH)  # the call host writes the log (sink)
        self.raw = bytearray()
        self.tracker = Tracker(_lane())
        self.tracker.set(["tools", CID], {"name": "bash", "args": {"command": "x"},
                                          "state": "running", "startedAt": 0,
                                          "output": self.cap.tool_output()})
        self.synced_spill = False

    def write(self, data: bytes) -> None:
        self.raw += data
        self.sink.write(data)  # the host's log: visible to a reader once flushed
        self.cap.set_totals(len(self.raw), self.raw.count(b"\n"))  # the host's progress
        self.cap.feed(data)

    def sync(self) -> None:
        self.tracker.set_text(BASE + ["content", 0, "text"], self.cap.text)
        self.tracker.set(BASE + ["truncation"], dict(self.cap.truncation))
        if self.cap.spill_path and not self.synced_spill:
            self.tracker.set(BASE + ["details", "spillPath"], self.cap.spill_path)
            self.synced_spill = True

    def end(self) -> None:
        self.cap.finish()
        self.sink.flush()  # the runner flushes (and closes) the spill before the result

    def result(self) -> ToolResult:
        """The ToolResult as a client decodes it from the daemon's answer."""
        details = {"truncation": dict(self.cap.truncation), "exitCode": 0}
        if self.cap.spill_path:
            details["spillPath"] = self.cap.spill_path
        return msgspec.convert({"callId": CID, "isError": False, "content": self.cap.text,
                                "details": details, "exitCode": 0}, ToolResult)

    def settle(self) -> None:
        self.tracker.delete(["tools", CID])
        self.tracker.push(["recent"], {"callId": CID, "exitCode": 0})


class Client:
    def __init__(self, daemon: Daemon, from_start: bool) -> None:
        self.daemon = daemon
        self.broken = [False]
        self.out = CompleteOutput(CID, lambda path: FakeSpill(daemon.sink, self.broken),
                                  from_start=from_start)
        self.encoder = Encoder()
        self.mirror = Mirror()
        self.seq = 0
        self.printed = bytearray()
        daemon.tracker.rebase()  # the subscription's base batch

    def publish(self) -> None:
        ops = self.daemon.tracker.flush()
        if not ops:
            return
        self.mirror.feed(self.seq, self.encoder.encode(ops))
        self.seq += 1
        self.out.update(self.mirror.last_ops, self.mirror.value)

    def resubscribe(self) -> None:
        self.daemon.tracker.rebase()
        self.encoder = Encoder()
        self.mirror.reset()
        self.seq = 0
        self.publish()

    def take(self) -> None:
        while True:
            data = self.out.take(limit=7)  # small pieces: more interleavings
            if not data:
                return
            self.printed += data


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:]) if b > a]


CLEAN = ["ab\n", "a", "é€\n", "xyz\n", "🙂b\n\t", "\x1b[1mq\n"]
UNCLEAN = ["a\x00b\n", "x\ry\n", "\x01\n", "ab\n"]

steps = st.lists(st.sampled_from(["write", "write", "write", "sync", "publish", "publish",
                                  "flush", "flush_some", "take", "take", "resubscribe"]),
                 max_size=80)


@st.composite
def runs(draw, alphabets):
    alphabet = draw(st.sampled_from(alphabets))
    size = draw(st.integers(0, 400))
    text = draw(st.text(alphabet=alphabet, min_size=size, max_size=size))
    data = text.encode()
    if alphabets is UNCLEAN and draw(st.booleans()):
        data += b"\xff\xfe" + data[:10]  # invalid UTF-8
    sizes = draw(st.lists(st.integers(1, 40), max_size=60))  # write sizes, then the rest
    cuts = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    limits = ShellOutputLimits(max_bytes=draw(st.integers(8, 120)),
                               max_lines=draw(st.integers(1, 12)))
    return data, _chunks(data, cuts), limits, draw(steps), draw(st.booleans())


def _play(data, chunks, limits, plan, last_publish, *, from_start=True, attach_after=0,
          check=None):
    daemon = Daemon(limits)
    client = Client(daemon, from_start) if attach_after == 0 else None
    pending = list(chunks)
    for i, step in enumerate(plan):
        if client is None and i >= attach_after:
            daemon.sync()
            client = Client(daemon, from_start)
            client.publish()
        if step == "write" and pending:
            daemon.write(pending.pop(0))
        elif step == "sync":
            daemon.sync()
        elif step == "publish" and client:
            daemon.sync()
            client.publish()
        elif step == "flush":
            daemon.sink.flush()
        elif step == "flush_some":
            daemon.sink.flush(5)
        elif step == "take" and client:
            client.take()
        elif step == "resubscribe" and client:
            client.resubscribe()
        if client and check:
            check(client)
    for chunk in pending:
        daemon.write(chunk)
    daemon.end()
    if client is None:
        daemon.sync()
        client = Client(daemon, from_start)
        client.publish()
    if last_publish:  # else the call leaves the lane in the flush of its last output
        daemon.sync()
        client.publish()
        client.take()
    daemon.settle()
    client.publish()
    client.take()
    client.out.finish(daemon.result())
    client.take()
    assert not client.out.behind
    return daemon, client


def _always_a_prefix(client):
    client.take()
    assert bytes(client.daemon.raw).startswith(bytes(client.printed))


@settings(max_examples=500, deadline=None)
@given(runs(CLEAN))
def test_run_prints_every_byte_once_in_any_interleaving(run):
    data, chunks, limits, plan, last_publish = run
    daemon, client = _play(data, chunks, limits, plan, last_publish, check=_always_a_prefix)
    assert bytes(client.printed) == data
    assert client.out.unshown() == 0


@settings(max_examples=300, deadline=None)
@given(runs(CLEAN), st.integers(0, 60))
def test_attach_prints_everything_from_the_first_window_on(run, attach_after):
    data, chunks, limits, plan, last_publish = run
    daemon, client = _play(data, chunks, limits, plan, last_publish, from_start=False,
                           attach_after=attach_after)
    printed = bytes(client.printed)
    start = client.out.start
    assert start is not None
    assert printed == data[start:]


@settings(max_examples=300, deadline=None)
@given(runs(UNCLEAN))
# Cleaning shrank (NULs) and grew (U+FFFD) the text by the same bytes: the totals fitted a
# reprint of the whole window. The call leaves the lane with its last output (the result
# gives the tail), or the lane appends it.
@example((b"a\x00\x00\x00\xff\xfea\x00\x00\x00", [b"a\x00", b"\x00\x00\xff\xfea\x00\x00\x00"],
          ShellOutputLimits(max_bytes=10, max_lines=1), ["write", "publish"], False))
@example((b"a\x00\x00\x00\xff\xfea\x00\x00\x00", [b"a\x00", b"\x00\x00\xff\xfea\x00\x00\x00"],
          ShellOutputLimits(max_bytes=10, max_lines=1), ["write", "publish", "write", "publish"],
          False))
def test_cleaned_output_is_never_printed_twice(run):
    """Output dshd cleaned (NUL, \\r, C0, invalid UTF-8) before the spill: what was printed
    live is the cleaned start, the rest comes raw from the spill file -- nothing twice."""
    data, chunks, limits, plan, last_publish = run
    daemon, client = _play(data, chunks, limits, plan, last_publish)
    printed = bytes(client.printed)
    out = client.out
    if out.switched_at is not None:
        at = out.switched_at
        assert out.mode == "spill" and out.position == len(data)
        assert printed.endswith(data[at:])
        live = printed[: len(printed) - (len(data) - at)]
        assert live in (data[:at], cleaned(data[:at]))
    elif daemon.cap.spill_path is None:  # never spilled: the window had it all, cleaned
        assert printed == cleaned(data)
    else:  # the live text could not be matched with the file: the old way, never longer
        assert len(printed) <= len(cleaned(data))


def test_a_flood_between_two_lane_flushes_comes_from_the_spill_file():
    daemon = Daemon(ShellOutputLimits(max_bytes=16, max_lines=4))
    client = Client(daemon, True)
    daemon.write(b"one\n")
    daemon.sync()
    client.publish()
    client.take()
    assert bytes(client.printed) == b"one\n" and client.out.mode == "live"
    flood = b"".join(b"%d\n" % i for i in range(1000))
    daemon.write(flood)
    daemon.sync()
    client.publish()  # the window slid far past what was printed
    client.take()
    assert client.out.mode == "switching" and client.out.behind  # the file is not there yet
    daemon.sink.flush(100)
    client.take()
    assert bytes(client.printed) == (b"one\n" + flood)[:100]
    daemon.sink.flush()
    client.take()
    assert bytes(client.printed) == b"one\n" + flood
    assert not client.out.behind


def test_unreadable_spill_falls_back_to_the_window_and_counts_what_is_missing():
    daemon = Daemon(ShellOutputLimits(max_bytes=16, max_lines=4))
    client = Client(daemon, True)
    client.broken[0] = True
    daemon.write(b"".join(b"%d\n" % i for i in range(100)))
    daemon.sync()
    client.publish()
    client.take()
    assert client.out.mode == "live"
    assert client.out.notes and "cannot read the spill file" in client.out.notes[0]
    assert bytes(client.printed) == daemon.cap.text.encode()  # the window, as before
    daemon.end()
    client.out.finish(daemon.result())
    client.take()
    assert client.out.unshown() == len(daemon.raw) - len(client.printed)


def test_a_read_error_in_spill_mode_goes_on_live_without_repeating():
    daemon = Daemon(ShellOutputLimits(max_bytes=16, max_lines=4))
    client = Client(daemon, True)
    first = b"".join(b"%d\n" % i for i in range(50))
    daemon.write(first)
    daemon.sink.flush()
    daemon.sync()
    client.publish()
    client.take()
    assert bytes(client.printed) == first and client.out.mode == "spill"
    client.broken[0] = True
    daemon.write(b"".join(b"%d\n" % i for i in range(50, 100)))
    daemon.sync()
    client.publish()
    client.take()
    assert client.out.mode == "fallback" and client.out.notes
    daemon.write(b"last\n")
    daemon.sync()
    client.publish()
    client.take()
    assert bytes(client.printed) == first + b"last\n"
    daemon.end()
    client.out.finish(daemon.result())
    client.take()
    assert client.out.unshown() == len(daemon.raw) - len(client.printed)


def test_give_up_on_a_spill_file_that_never_comes_prints_what_was_held():
    daemon = Daemon(ShellOutputLimits(max_bytes=16, max_lines=4))
    client = Client(daemon, True)
    daemon.write(b"".join(b"%d\n" % i for i in range(100)))
    daemon.sync()
    client.publish()
    client.take()
    assert client.printed == b"" and client.out.switching
    client.out.give_up()
    client.take()
    assert bytes(client.printed) == daemon.cap.text.encode()
    assert not client.out.behind and client.out.mode == "live"


def test_without_an_opener_it_is_the_live_window_only():
    daemon = Daemon(ShellOutputLimits(max_bytes=16, max_lines=4))
    out = CompleteOutput(CID, None)
    daemon.write(b"".join(b"%d\n" % i for i in range(100)))
    daemon.end()
    out.finish(daemon.result())
    assert out.take() == daemon.cap.text.encode() and out.take() == b""
    assert out.unshown() == len(daemon.raw) - len(daemon.cap.text)


# ---------------------------------------------------------------------- helpers
@given(st.binary(max_size=12))
def test_incomplete_utf8_tail_is_what_the_decoder_holds_back(data):
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data)
    assert incomplete_utf8_tail(data) == len(decoder.getstate()[0])


def test_cleaned_is_the_daemons_cleaning():
    from dshd.execution.capture import clean_text

    for raw in (b"a\x00b\r\n\x1b[0m\t", b"\xff\xfeok", "é€🙂".encode()):
        assert cleaned(raw) == clean_text(raw.decode("utf-8", "replace")).encode()


def test_spill_file_reads_a_file_that_may_not_exist_yet(tmp_path):
    path = tmp_path / "spill" / "c.log"
    spill = SpillFile(str(path))
    assert spill.size() is None
    path.parent.mkdir()
    path.write_bytes(b"hello")
    assert spill.size() == 5 and spill.read(1, 3) == b"ell"
    os.unlink(path)  # deleted after it was opened: still readable
    assert spill.read(0, 5) == b"hello"
    spill.close()
    with pytest.raises(OSError):
        SpillFile("relative/path").size()
