"""Mirror: base batches reset, gaps and bad batches raise MirrorBroken, the vectors apply."""

from __future__ import annotations

import copy

import pytest

from protocol.mirror import Mirror, MirrorBroken
from protocol.codec import Encoder


def test_nothing_before_a_base():
    m = Mirror()
    assert m.value is None and m.seq is None and not m.ready
    with pytest.raises(MirrorBroken, match="before any base"):
        m.feed(0, [["a", ["x"], "1"]])
    assert not m.ready


def test_base_then_deltas_then_base_resets_value_and_decoder():
    m = Mirror()
    m.feed(0, [["r", {"x": "", "y": 1}]])
    m.feed(1, [["a", ["x"], "ab"]])
    m.feed(2, [["#", 0, ["x"]], ["a", 0, "c"]])
    assert m.value == {"x": "abc", "y": 1} and m.seq == 2
    assert [[op[0], list(op[1]), op[2]] for op in m.last_ops] == [["a", ["x"], "c"]]
    # A base in the middle of a stream (daemon-side overflow: next seq) starts over.
    m.feed(3, [["r", {"z": []}]])
    assert m.value == {"z": []} and m.seq == 3
    # The old table is gone: id 0 is undefined after the base.
    with pytest.raises(MirrorBroken, match="ref"):
        m.feed(4, [["a", 0, "x"]])


def test_seq_gap_raises_and_resets():
    m = Mirror()
    m.feed(0, [["r", {"x": ""}]])
    m.feed(1, [["a", ["x"], "1"]])
    with pytest.raises(MirrorBroken, match="seq gap: expected 2, got 3") as info:
        m.feed(3, [["a", ["x"], "3"]])
    assert info.value.seq == 3
    assert m.value is None and not m.ready
    # Only a base heals it, at any seq.
    with pytest.raises(MirrorBroken):
        m.feed(4, [["a", ["x"], "4"]])
    m.feed(0, [["r", {"x": "fresh"}]])
    assert m.value == {"x": "fresh"}


def test_repeated_seq_is_a_gap_too():
    m = Mirror()
    m.feed(5, [["r", [0]]])
    with pytest.raises(MirrorBroken, match="seq gap"):
        m.feed(5, [["s", [0], 1]])


@pytest.mark.parametrize(
    "bad",
    [
        [["a", 7, "x"]],                 # undefined ref
        [["zz", ["x"], 1]],              # unknown verb
        [["a", "x"]],                    # shortened op first in the batch
        [["a", ["x"], "1", "extra"]],    # arity
        [["a", ["__proto__"], "x"]],     # reserved segment
        [["t", ["x"], 99]],              # range (apply)
        [["d", ["nope"]]],               # missing key (apply)
        [["a", ["n"], "x"]],             # type (apply): n is an int
        "not a batch",                   # type (decode)
    ],
)
def test_decode_and_apply_errors_raise_mirror_broken(bad):
    m = Mirror()
    m.feed(0, [["r", {"x": "ab", "n": 1}]])
    with pytest.raises(MirrorBroken):
        m.feed(1, bad)
    assert m.value is None and not m.ready


def test_empty_batch_is_a_no_op_delta():
    m = Mirror()
    m.feed(0, [["r", {"x": 1}]])
    m.feed(1, [])
    assert m.value == {"x": 1} and m.seq == 1


def test_conformance_encode_vectors_through_the_mirror(ops_vectors):
    for case in ops_vectors["encode"]:
        m = Mirror()
        for seq, wire in enumerate(case["wire"]):
            m.feed(seq, copy.deepcopy(wire))
        assert m.value == case["final"], case["name"]


def test_conformance_encoder_output_through_the_mirror(ops_vectors):
    """Our own encoder's batches (not only the recorded wire) mirror to the same value."""
    for case in ops_vectors["encode"]:
        enc = Encoder()
        m = Mirror()
        for seq, batch in enumerate(case["ops"]):
            m.feed(seq, enc.encode(copy.deepcopy(batch)))
        assert m.value == case["final"], case["name"]


def test_conformance_bad_wire_vectors_break_the_mirror(ops_vectors):
    for case in ops_vectors["bad_wire"]:
        m = Mirror()
        with pytest.raises(MirrorBroken, match=case["error"]):
            for seq, wire in enumerate(case["wire"]):
                m.feed(seq, copy.deepcopy(wire))

