"""apply() against hostile and edge-case ops (OPS.md §1–§2), beyond the vectors."""

from __future__ import annotations

import math

import pytest

from protocol import OpError, apply, is_base
from protocol.ops import MAX_SAFE_INT


class Opaque:
    """A class instance that is no JSON value, with a repr that is the same in every
    process (pytest-xdist workers must collect identical test ids)."""

    def __repr__(self) -> str:
        return "<Opaque>"


def kind_of(doc, ops):
    with pytest.raises(OpError) as info:
        apply(doc, ops)
    return info.value.kind


@pytest.mark.parametrize("seg", ["__proto__", "constructor", "prototype"])
@pytest.mark.parametrize(
    "op",
    [
        lambda s: ["s", [s], 1],
        lambda s: ["s", ["a", s], 1],
        lambda s: ["d", [s]],
        lambda s: ["a", [s], "x"],
        lambda s: ["t", ["a", s], 0],
        lambda s: ["p", [s], 0, 0, []],
    ],
)
def test_reserved_segment_in_every_verb(seg, op):
    doc = {"a": {seg: "x"}, seg: []}
    assert kind_of(doc, [op(seg)]) == "reserved"


def test_reserved_words_are_fine_inside_values():
    doc = apply({}, [["s", ["k"], {"constructor": {"prototype": ["__proto__"]}}]])
    assert doc == {"k": {"constructor": {"prototype": ["__proto__"]}}}


@pytest.mark.parametrize(
    "doc, op, kind",
    [
        ({"l": [1]}, ["s", ["l", True], 2], "path"),
        ({"l": [1]}, ["s", ["l", False], 2], "path"),
        ({"l": ["x"]}, ["a", ["l", False], "y"], "path"),
        ({"l": [1]}, ["s", ["l", 1.0], 2], "path"),
        ({"l": [1]}, ["s", ["l", -1], 2], "path"),
        ({"l": [1]}, ["s", ["l", None], 2], "path"),
        ({"l": [1]}, ["s", ["l", ["x"]], 2], "path"),
        ({"l": [1]}, ["s", ["l", 2**64], 2], "path"),
        ({"l": [1]}, ["s", ["l", MAX_SAFE_INT], 2], "range"),
        ({"l": [[1]]}, ["s", ["l", 5, 0], 2], "range"),
        ({"t": "abc"}, ["t", ["t"], True], "type"),
        ({"t": "abc"}, ["t", ["t"], 1.0], "type"),
        ({"t": "abc"}, ["t", ["t"], "1"], "type"),
        ({"t": "abc"}, ["t", ["t"], 2**70], "range"),
        ({"t": "abc"}, ["a", ["t"], 5], "type"),
        ({"t": "abc"}, ["a", ["t"], None], "type"),
        ({"t": 5}, ["t", ["t"], 0], "type"),
        ({"l": [1]}, ["p", ["l"], True, 0, []], "type"),
        ({"l": [1]}, ["p", ["l"], 0, False, []], "type"),
        ({"l": [1]}, ["p", ["l"], -1, 0, []], "type"),
        ({"l": [1]}, ["p", ["l"], 0, -1, []], "type"),
        ({"l": [1]}, ["p", ["l"], 0, 2**70, []], "range"),
        ({"l": [1]}, ["p", ["l"], 0, 0, {"a": 1}], "type"),
        ({"l": [1]}, ["p", ["l"], 0, 0, None], "type"),
        ({"l": "abc"}, ["p", ["l"], 0, 0, []], "type"),
        ({}, ["p", [], 0, 0, []], "type"),
        ({"a": 1}, ["d", ["a", "b"]], "path"),
        ({"a": "s"}, ["a", ["a", "b"], "x"], "path"),
        ({"a": {}}, ["d", ["a", 0]], "path"),
        ({}, ["a", [], "x"], "path"),
        ({}, ["t", [], 0], "path"),
        ({}, ["r"], "arity"),
        ({}, ["r", 1, 2], "arity"),
        ({}, ["d", ["a"], 1], "arity"),
        ({}, ["p", [], 0, 0], "arity"),
        ({}, [], "arity"),
        ({}, "s", "type"),
        ({}, None, "type"),
        ({}, [None, ["a"]], "verb"),
        ({}, [1, ["a"]], "verb"),
        ({}, ["S", ["a"], 1], "verb"),
        ({}, ["#", 0, ["a"]], "verb"),
        ({}, ["s", {"a": 1}, 1], "path"),
        ({}, ["s", None, 1], "path"),
    ],
)
def test_hostile_op(doc, op, kind):
    assert kind_of(doc, [op]) == kind


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        MAX_SAFE_INT + 1,
        -MAX_SAFE_INT - 1,
        (1, 2),
        {1, 2},
        b"bytes",
        {1: "int key"},
        {"ok": [Opaque()]},
        "lone \ud800 surrogate",
        [[[[{"deep": math.nan}]]]],
    ],
    ids=repr,
)
@pytest.mark.parametrize("where", ["s", "p", "r"])
def test_non_json_values_are_type_errors(value, where):
    ops = {
        "s": [["s", ["k"], value]],
        "p": [["p", ["l"], 0, 0, [value]]],
        "r": [["r", value]],
    }[where]
    assert kind_of({"l": []}, ops) == "type"


def test_safe_integer_bounds_are_accepted():
    doc = apply({}, [["s", ["a"], MAX_SAFE_INT], ["s", ["b"], -MAX_SAFE_INT]])
    assert doc == {"a": MAX_SAFE_INT, "b": -MAX_SAFE_INT}


def test_deep_value_is_not_a_recursion_error():
    deep = []
    for _ in range(20_000):
        deep = [deep]
    doc = apply({}, [["s", ["x"], deep]])
    depth, node = 0, doc["x"]
    while node:
        node, depth = node[0], depth + 1
    assert depth == 20_000
    bad = [math.inf]
    for _ in range(20_000):
        bad = {"k": bad}
    assert kind_of({}, [["s", ["x"], bad]]) == "type"


def test_cycle_is_rejected():
    cyc: list = []
    cyc.append(cyc)
    assert kind_of({}, [["s", ["x"], cyc]]) == "type"


def test_shared_subvalue_is_copied_not_a_cycle():
    shared = {"a": [1]}
    doc = apply({}, [["s", ["x"], [shared, shared]]])
    doc["x"][0]["a"].append(2)
    assert doc["x"][1] == {"a": [1]}


def test_applying_one_batch_to_two_mirrors_keeps_them_independent():
    batch = [["r", {"l": [], "t": ""}], ["p", ["l"], 0, 0, [{"n": []}]]]
    m1 = apply(None, batch)
    m2 = apply(None, batch)
    apply(m1, [["p", ["l", 0, "n"], 0, 0, [1]]])
    assert m2 == {"l": [{"n": []}], "t": ""}
    assert batch[1][4] == [{"n": []}]


def test_ops_are_applied_in_order_and_error_names_the_op():
    with pytest.raises(OpError) as info:
        apply({"a": ""}, [["a", ["a"], "x"], ["s", ["b"], 1], ["d", ["zz"]]])
    assert info.value.kind == "missing"
    assert "op 2" in str(info.value)


def test_code_points_not_utf16_or_bytes():
    doc = apply({"t": "a😀é"}, [["t", ["t"], 2], ["a", ["t"], "😀"]])
    assert doc == {"t": "é😀"}
    assert kind_of({"t": "😀"}, [["t", ["t"], 2]]) == "range"


def test_r_anywhere_replaces_root_and_root_splice():
    assert apply({"a": 1}, [["s", ["a"], 2], ["r", []], ["p", [], 0, 0, [1, 2]]]) == [1, 2]
    assert apply([1, 2, 3], [["s", [1], "x"], ["s", [3], 4]]) == [1, "x", 3, 4]


def test_tuples_accepted_as_ops_and_paths():
    doc = apply({"l": [1]}, (("s", ("l", 1), 2), ("p", ("l",), 0, 1, (7,))))
    assert doc == {"l": [7, 2]}


def test_is_base():
    assert is_base([["r", {}]])
    assert is_base([("r", 1), ("s", ["a"], 1)])
    assert not is_base([])
    assert not is_base([["s", ["a"], 1], ["r", {}]])
