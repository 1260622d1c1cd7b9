"""The client's raw channel (``client.raw``, ``client.transport.FollowInbox``) and the detach
keys (``client.cli.keys``): pure parts directly, the protocol against the fake peer, which
plays ``tool.read`` over a byte string and ``tool.follow`` as the test scripts it. A real
daemon's raw channel is tests/e2e/test_cli_tty*.py's."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile

import pytest
import trio

from client.api import connect
from client.cli.keys import DetachScanner, describe_keys, parse_detach_keys
from client.raw import Chunk, End, Gap, RawAnswerError, tail_offset
from client.transport import FOLLOW_INBOX_BYTES
from fake_dshd import FakeDshd, FakeError


# ---------------------------------------------------------------------- detach keys
@pytest.mark.parametrize("spec, keys", [
    ("ctrl-p,ctrl-q", b"\x10\x11"),
    ("CTRL-A, d", b"\x01d"),
    ("ctrl-@,ctrl-[,ctrl-\\,ctrl-],ctrl-^,ctrl-_", bytes([0, 27, 28, 29, 30, 31])),
    ("a", b"a"),
    ("", b""),
])
def test_detach_keys_parse_like_docker(spec, keys):
    assert parse_detach_keys(spec) == keys


@pytest.mark.parametrize("spec", ["ctrl-", "ctrl-1", "ab", "ctrl-p,,ctrl-q", "é",
                                  ",".join("a" * 1 for _ in range(17))])
def test_bad_detach_keys_say_why(spec):
    with pytest.raises(ValueError, match="detach"):
        parse_detach_keys(spec)


def test_describe_keys():
    assert describe_keys(b"\x10\x11") == "Ctrl-P Ctrl-Q"
    assert describe_keys(b"\x1dq") == "Ctrl-] q"


def test_scanner_detaches_on_the_whole_sequence_only():
    s = DetachScanner(b"\x10\x11")
    assert s.feed(b"ls\r") == (b"ls\r", False)
    assert s.feed(b"\x10") == (b"", False)  # held: it may start the sequence
    assert s.feed(b"x") == (b"\x10x", False)  # it did not: sent as typed
    assert s.feed(b"\x10\x10") == (b"\x10", False)  # the second Ctrl-P may start it again
    assert s.feed(b"\x11rest") == (b"", True)  # the sequence never reaches the command
    s = DetachScanner(b"\x10\x11")
    assert s.feed(b"abc\x10\x11") == (b"abc", True)
    assert DetachScanner(b"").feed(b"\x10\x11") == (b"\x10\x11", False)  # turned off
    assert DetachScanner(b"\x03").feed(b"a\x03") == (b"a", True)


# ---------------------------------------------------------------------- the fake peer
@pytest.fixture
async def fake(nursery):
    d = tempfile.mkdtemp(prefix="dsh-r-", dir="/tmp")
    server = FakeDshd(os.path.join(d, "fake.sock"))
    await nursery.start(server.serve)
    yield server
    shutil.rmtree(d, ignore_errors=True)


def serve_log(fake: FakeDshd, data: bytes, first: int = 0, limit: int = 1000) -> None:
    """``tool.read`` over ``data`` (absolute offsets; bytes before ``first`` dropped)."""

    async def read(params):
        offset = params["offset"]
        if offset < first:
            raise FakeError(-32602, "before the first retained byte", {"firstOffset": first})
        if offset > len(data):
            raise FakeError(-32602, "past the end", {"endOffset": len(data)})
        piece = data[offset: offset + min(params.get("limit", limit), limit)]
        return {"offset": offset, "data": base64.b64encode(piece).decode(),
                "firstOffset": first, "endOffset": len(data),
                "eof": offset + len(piece) == len(data)}

    fake.handlers["tool.read"] = read


def tail_lines(data: bytes, n: int) -> bytes:
    done = subprocess.run(["tail", "-n", str(n)], input=data, capture_output=True, check=True)
    return done.stdout


@pytest.mark.parametrize("data", [
    b"", b"x", b"\n", b"\n\n\n", b"a\nb\nc\n", b"a\nb\nc", b"only one line",
    b"".join(b"%d\n" % i for i in range(1, 3000)),
    b"".join(b"%d\n" % i for i in range(1, 3000)) + b"no newline at the end",
])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 2999, 10_000])
async def test_tail_offset_agrees_with_tail_n(fake, data, n):
    serve_log(fake, data, limit=777)  # small reads: the scan crosses many pieces
    import client.raw as raw
    old, raw.TAIL_READ = raw.TAIL_READ, 1000
    try:
        async with connect(fake.path) as c:
            offset, first = await tail_offset(c, "s1", "c1", n)
    finally:
        raw.TAIL_READ = old
    assert first == 0
    assert data[offset:] == (tail_lines(data, n) if n else b"")


async def test_tail_offset_stops_at_the_first_retained_byte(fake):
    data = b"".join(b"%d\n" % i for i in range(1, 1001))
    first = data.index(b"\n990\n") + 1
    serve_log(fake, data, first=first)
    async with connect(fake.path) as c:
        offset, got_first = await tail_offset(c, "s1", "c1", 100)
        assert (offset, got_first) == (first, first)
        offset, _ = await tail_offset(c, "s1", "c1", 5)
        assert data[offset:] == b"996\n997\n998\n999\n1000\n"


def output(follow_id: str, **params) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": "output",
                       "params": {"followId": follow_id, **params}}).encode() + b"\n"


def script_follow(fake: FakeDshd, play) -> None:
    """``tool.follow`` answers ``f1``; ``play(send)`` then sends its notifications."""

    async def follow(params):
        stream = fake._streams[-1]

        async def run():
            await play(lambda data: fake._send(stream, data))

        fake.nursery.start_soon(run)
        return {"followId": "f1"}

    fake.handlers["tool.follow"] = follow
    fake.handlers["tool.unfollow"] = lambda params: _empty()


async def _empty():
    return {}


async def test_follow_yields_chunks_gaps_and_the_end_in_order(fake):
    async def play(send):
        await send(output("other", offset=0, data=base64.b64encode(b"not mine").decode()))
        await send(output("f1", offset=0, data=base64.b64encode(b"\x00\r\n\xff").decode()))
        await send(output("f1", gap={"from": 4, "to": 100}))
        await send(output("f1", offset=100, data=base64.b64encode(b"tail").decode()))
        await send(output("f1", offset=104, eof=True, exitCode=3))

    script_follow(fake, play)
    async with connect(fake.path) as c:
        async with await c.follow_output("s1", "c1", 0) as follow:
            items = [item async for item in follow]
    assert items == [Chunk(0, b"\x00\r\n\xff"), Gap(4, 100), Chunk(100, b"tail"), End(104, 3)]


async def test_a_hole_without_a_gap_is_an_error_not_silence(fake):
    async def play(send):
        await send(output("f1", offset=0, data=base64.b64encode(b"abc").decode()))
        await send(output("f1", offset=10, data=base64.b64encode(b"def").decode()))

    script_follow(fake, play)
    async with connect(fake.path) as c:
        async with await c.follow_output("s1", "c1", 0) as follow:
            with pytest.raises(RawAnswerError, match="jumped from offset 3 to 10"):
                async for _ in follow:
                    pass


async def test_a_slow_follower_loses_nothing_and_holds_a_bounded_inbox(fake):
    """The reader stops reading while a follower's inbox is full (the daemon's follower
    pauses), so a reader 50 MiB behind holds at most the budget plus one read, and gets
    every byte; a request on the same connection is answered once the follower drains."""
    piece = bytes(range(256)) * 1024  # 256 KiB, every byte value
    count = 200

    async def play(send):
        for i in range(count):
            await send(output("f1", offset=i * len(piece),
                              data=base64.b64encode(piece).decode()))
        await send(output("f1", offset=count * len(piece), eof=True, exitCode=0))

    script_follow(fake, play)
    got = 0
    peak = 0
    async with connect(fake.path) as c:
        async with await c.follow_output("s1", "c1", 0) as follow:
            inbox = follow._inbox
            async for item in follow:
                peak = max(peak, inbox._bytes)
                if isinstance(item, Chunk):
                    assert item.data == piece
                    got += len(item.data)
                    if got in (len(piece), 100 * len(piece)):
                        await trio.sleep(1)  # slow: the inbox fills, the reader waits
    assert got == count * len(piece)
    assert peak <= FOLLOW_INBOX_BYTES + 2 * 400_000  # the budget, plus what one read completes
