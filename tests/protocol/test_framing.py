"""protocol.framing.LineBuffer: lines out of arbitrary chunks, the oversize rule, the budget."""

from __future__ import annotations

import random

import pytest

from protocol.framing import NEED_DATA, LineBuffer, OverBudget, Oversize


class Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n
        assert self.used >= 0, "gave back more than was taken"


def drain(buf: LineBuffer) -> list:
    out = []
    while (event := buf.next_event()) is not NEED_DATA:
        out.append(bytes(event) if isinstance(event, (bytes, bytearray)) else event)
        if isinstance(event, OverBudget):
            break
    return out


def feed_all(buf: LineBuffer, chunks) -> list:
    out = drain(buf)
    for chunk in chunks:
        buf.feed(chunk)
        out += drain(buf)
    return out


def test_lines_come_out_whole_whatever_the_chunking():
    data = b'{"a":1}\n\n  \n{"b":[2,3]}\n{"c":"x y"}\npartial'
    want = [b'{"a":1}', b'{"b":[2,3]}', b'{"c":"x y"}']
    rng = random.Random(11)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, 8)))
        chunks = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)])]
        budget = Budget(1 << 20)
        buf = LineBuffer(1024, budget)
        assert feed_all(buf, chunks) == want
        assert buf.held == len(b"partial") == budget.used  # only the unfinished tail is held
        buf.close()
        assert budget.used == 0


def test_an_oversize_line_is_reported_once_at_its_newline_and_the_next_line_survives():
    budget = Budget(1 << 20)
    buf = LineBuffer(8, budget)
    out = feed_all(buf, [b"ok\n0123", b"456789", b"abc", b"def\nafter\n"])
    assert [type(e) for e in out] == [bytes, Oversize, bytes]
    assert out[0] == b"ok" and out[2] == b"after" and out[1].limit == 8
    assert budget.used == 0  # the oversize bytes were never kept


def test_discarding_is_visible_before_the_newline_and_memory_stays_bounded():
    buf = LineBuffer(8)
    buf.feed(b"x" * 5)
    assert buf.next_event() is NEED_DATA and not buf.discarding
    buf.feed(b"x" * 5)
    assert buf.next_event() is NEED_DATA and buf.discarding  # a client may close here
    for _ in range(100):
        buf.feed(b"x" * 1000)
        assert buf.next_event() is NEED_DATA
        assert buf.held == 0
    buf.feed(b"\nnext\n")
    assert isinstance(buf.next_event(), Oversize) and not buf.discarding
    assert buf.next_event() == b"next"


def test_a_line_of_exactly_the_limit_passes_and_one_more_byte_does_not():
    buf = LineBuffer(8)
    assert feed_all(buf, [b"12345678\n"]) == [b"12345678"]
    assert feed_all(buf, [b"1234", b"5678\n"]) == [b"12345678"]
    assert [type(e) for e in feed_all(buf, [b"1234", b"56789\n"])] == [Oversize]
    assert [type(e) for e in feed_all(buf, [b"123456789\n"])] == [Oversize]


def test_a_handed_out_line_holds_its_budget_until_the_next_call():
    budget = Budget(1 << 20)
    buf = LineBuffer(1024, budget)
    buf.feed(b"abc")
    assert buf.next_event() is NEED_DATA and budget.used == 3
    buf.feed(b"def\n")
    assert buf.next_event() == b"abcdef"
    assert budget.used == 6  # the consumer is handling it: still counted
    assert buf.next_event() is NEED_DATA
    assert budget.used == 0


def test_a_line_inside_one_chunk_costs_no_budget():
    budget = Budget(0)
    buf = LineBuffer(1024, budget)
    assert feed_all(buf, [b"one\ntwo\n"]) == [b"one", b"two"]


def test_over_budget_finishes_the_buffer_and_gives_everything_back():
    budget = Budget(10)
    buf = LineBuffer(1024, budget)
    out = feed_all(buf, [b"12345", b"678", b"90abc"])
    assert len(out) == 1 and isinstance(out[0], OverBudget) and out[0].wanted == 5
    assert budget.used == 0 and buf.held == 0
    buf.feed(b"more\n")
    assert buf.next_event() is NEED_DATA  # finished: nothing more comes out


def test_feeding_before_the_buffer_asked_for_data_is_an_error():
    buf = LineBuffer(16)
    buf.feed(b"a\nb\n")
    assert buf.next_event() == b"a"
    with pytest.raises(RuntimeError):
        buf.feed(b"c\n")
