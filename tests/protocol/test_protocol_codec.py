"""Encoder/Decoder beyond the vectors: hostile wire input, bounds, atomicity (OPS.md §3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import Decoder, Encoder, OpError, apply
from protocol.codec import MAX_TABLE, decode_json, encode_json


def decode_kind(*batches):
    dec = Decoder()
    with pytest.raises(OpError) as info:
        for b in batches:
            dec.decode(b)
    return info.value.kind


BASE = [["r", {"a": "", "b": ""}]]


@pytest.mark.parametrize(
    "batch, kind",
    [
        ([["a", 2**64, "x"]], "ref"),
        ([["a", -1, "x"]], "ref"),
        ([["a", 0, "x"]], "ref"),
        ([["#", 0, ["a"]], ["a", 1, "x"]], "ref"),
        ([["#", 2**70, ["a"]]], "ref"),
        ([["#", -1, ["a"]]], "ref"),
        ([["#", True, ["a"]]], "ref"),
        ([["#", False, ["a"]]], "ref"),
        ([["#", "0", ["a"]]], "ref"),
        ([["#", 0, ["a"]], ["#", 0, ["b"]]], "ref"),
        ([["#", 0]], "arity"),
        ([["#", 0, ["a"], 1]], "arity"),
        ([["#", 0, 0]], "path"),
        ([["#", 0, None]], "path"),
        ([["#", 0, ["a", True]]], "path"),
        ([["#", 0, ["a", -1]]], "path"),
        ([["#", 0, ["constructor"]]], "reserved"),
        ([["a", ["prototype"], "x"]], "reserved"),
        ([["a", False, "x"]], "path"),
        ([["a", 1.0, "x"]], "path"),
        ([["a", "a", "x"]], "path"),
        ([["a", None, "x"]], "path"),
        ([["a", {"0": 1}, "x"]], "path"),
        ([["d"]], "ref"),
        ([["p", 0, 0, []]], "ref"),
        ([["r", {}], ["s", 1]], "ref"),
        ([["a", ["a"], "x"], ["#", 0, ["b"]], ["r", {}], ["a", "y"]], "ref"),
        ([["a"]], "arity"),
        ([["a", ["a"], "x", "y"]], "arity"),
        ([["p", ["a"], 0, 0, [], 1]], "arity"),
        ([["r"]], "arity"),
        ([["r", {}, 1]], "arity"),
        ([[]], "arity"),
        (["a"], "type"),
        ([None], "type"),
        ([["zz", ["a"], 1]], "verb"),
        ([[7, ["a"], 1]], "verb"),
        ([[None]], "verb"),
        ([["s", [], 1]], "path"),
        ([["#", 0, []], ["a", 0, "x"]], "path"),
        ([["p", [], 0, 0, []], ["a", "x"]], "path"),
    ],
)
def test_hostile_wire(batch, kind):
    assert decode_kind(BASE, batch) == kind


def test_batch_not_a_list():
    assert decode_kind({"ops": []}) == "type"
    assert decode_kind("r") == "type"


def test_failed_batch_leaves_the_table_unchanged():
    dec = Decoder()
    dec.decode(BASE)
    dec.decode([["#", 0, ["a"]], ["a", 0, "x"]])
    with pytest.raises(OpError):
        dec.decode([["#", 1, ["b"]], ["a", 1, "y"], ["a", 9, "z"]])
    assert dec.statistics() == {"table": 1}
    # id 1 was rolled back, so it may be defined again, and id 0 still works
    assert dec.decode([["#", 1, ["b"]], ["a", 1, "y"], ["a", 0, "z"]]) == [
        ["a", ["b"], "y"],
        ["a", ["a"], "z"],
    ]
    with pytest.raises(OpError):
        dec.decode([["r", {}], ["a", 0, "q"]])  # the r inside a failed batch does not reset
    assert dec.decode([["a", 1, "w"]]) == [["a", ["b"], "w"]]


def test_encoder_rejects_bad_ops_without_state_change():
    enc = Encoder()
    enc.encode([["r", {}]])
    enc.encode([["s", ["a"], 1]])
    for bad in ([["s", ["a"], 1], ["s", ["__proto__"], 1]], [["x", ["a"]]], [["s", ["a"]]], [["s", [], 1]], "r"):
        with pytest.raises(OpError):
            enc.encode(bad)
    assert enc.statistics() == {"table": 0, "seen": 1}
    assert enc.encode([["s", ["a"], 2]]) == [["#", 0, ["a"]], ["s", 0, 2]]


def test_definition_does_not_change_prev():
    dec = Decoder()
    dec.decode(BASE)
    ops = dec.decode([["a", ["a"], "x"], ["#", 0, ["b"]], ["a", "y"], ["a", 0, "z"], ["a", "w"]])
    assert ops == [["a", ["a"], "x"], ["a", ["a"], "y"], ["a", ["b"], "z"], ["a", ["b"], "w"]]


def test_decoded_paths_are_fresh_lists():
    dec = Decoder()
    dec.decode(BASE)
    first = dec.decode([["#", 0, ["a"]], ["a", 0, "x"], ["a", "y"]])
    first[0][1].append("mutated")
    assert first[1][1] == ["a"]
    assert dec.decode([["a", 0, "z"]]) == [["a", ["a"], "z"]]


def test_decoder_table_is_bounded():
    dec = Decoder()
    defs = [["#", i, ["k", i]] for i in range(MAX_TABLE)]
    dec.decode([["r", {}]] + defs)
    assert dec.statistics() == {"table": MAX_TABLE}
    with pytest.raises(OpError) as info:
        dec.decode([["#", MAX_TABLE, ["k", "last"]]])
    assert info.value.kind == "range"
    dec.decode([["r", {}], ["#", 0, ["x"]]])
    assert dec.statistics() == {"table": 1}


def test_encoder_table_and_seen_are_bounded_and_stay_decodable():
    enc, dec = Encoder(), Decoder()
    n = MAX_TABLE + 10
    doc = dec.decode(enc.encode([["r", {}]]))
    doc = apply(None, doc)
    first = [["s", [f"k{i}"], i] for i in range(n)]
    doc = apply(doc, dec.decode(enc.encode(first)))
    stats = enc.statistics()
    assert stats["seen"] == MAX_TABLE and stats["table"] == 0
    second = [["s", [f"k{i}"], -i] for i in range(n)]
    wire = enc.encode(second)
    defs = [w for w in wire if w[0] == "#"]
    assert len(defs) == MAX_TABLE and defs[-1][1] == MAX_TABLE - 1
    assert enc.statistics()["table"] == MAX_TABLE
    doc = apply(doc, dec.decode(wire))
    assert doc == {f"k{i}": -i for i in range(n)}
    third = enc.encode([["s", ["k0"], 0], ["s", [f"k{n - 1}"], 1], ["s", ["new"], 1], ["s", ["new"], 2]])
    assert third == [["s", 0, 0], ["s", [f"k{n - 1}"], 1], ["s", ["new"], 1], ["s", 2]]
    apply(doc, dec.decode(third))


def test_r_mid_batch_resets_both_sides():
    enc, dec = Encoder(), Decoder()
    batches = [
        [["r", {"a": ""}]],
        [["a", ["a"], "1"], ["a", ["a"], "2"]],
        [["a", ["a"], "3"], ["r", {"a": "x"}], ["a", ["a"], "4"]],
        [["a", ["a"], "5"]],
    ]
    wires = [enc.encode(b) for b in batches]
    assert wires[2] == [["#", 0, ["a"]], ["a", 0, "3"], ["r", {"a": "x"}], ["a", ["a"], "4"]]
    assert wires[3] == [["#", 0, ["a"]], ["a", 0, "5"]]
    doc = None
    for w, b in zip(wires, batches):
        ops = dec.decode(w)
        assert ops == b
        doc = apply(doc, ops)
    assert doc == {"a": "x45"}


paths = st.lists(
    st.one_of(st.sampled_from(["a", "b", "c", "__x"]), st.integers(0, 3)), max_size=3
).map(tuple)
op_st = st.one_of(
    st.tuples(st.just("s"), paths.filter(bool), st.integers()),
    st.tuples(st.just("d"), paths.filter(bool)),
    st.tuples(st.just("a"), paths.filter(bool), st.text(max_size=3)),
    st.tuples(st.just("t"), paths.filter(bool), st.integers(0, 5)),
    st.tuples(st.just("p"), paths, st.integers(0, 3), st.integers(0, 3), st.lists(st.integers(), max_size=2)),
    st.tuples(st.just("r"), st.integers()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(op_st, max_size=8), max_size=8))
def test_decode_inverts_encode(batches):
    """For any op stream (applicable or not), decode(encode(batch)) == batch, via JSON bytes."""
    enc, dec = Encoder(), Decoder()
    for batch in batches:
        ops = [list(op[:1]) + [list(op[1])] + list(op[2:]) if op[0] != "r" else list(op) for op in batch]
        wire = decode_json(encode_json(enc.encode(ops)))
        assert len(wire) <= 2 * len(ops)
        assert dec.decode(wire) == ops


def test_base_forgets_seen_paths():
    """A path used once before a base is, after it, a first use again: inline (OPS.md §3)."""
    enc = Encoder()
    enc.encode([["r", {"a": ""}]])
    assert enc.encode([["a", ["a"], "1"]]) == [["a", ["a"], "1"]]
    assert enc.encode([["r", {"a": ""}], ["a", ["a"], "2"]]) == [["r", {"a": ""}], ["a", ["a"], "2"]]
    assert enc.encode([["a", ["a"], "3"]]) == [["#", 0, ["a"]], ["a", 0, "3"]]
    assert enc.statistics() == {"table": 1, "seen": 0}
