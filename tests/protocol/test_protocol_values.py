"""JSON values, paths and op shapes (OPS.md §1–§2): check_json_value, copies, strict equality."""

from __future__ import annotations

import collections
import datetime
import enum
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import OpError, check_json_value, check_path, validate_op
from protocol.codec import decode_json, encode_json
from protocol.errors import OP_ERROR_KINDS
from protocol.ops import MAX_SAFE_INT, RESERVED, copy_json_value, json_equal


class Opaque:
    """A class instance that is no JSON value, with a repr that is the same in every
    process (pytest-xdist workers must collect identical test ids)."""

    def __repr__(self) -> str:
        return "<Opaque>"


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


GOOD = [None, True, False, 0, -1, MAX_SAFE_INT, -MAX_SAFE_INT, 0.5, -0.0, 1e300, "", "😀",
        [], {}, {"__proto__": {"constructor": [1, "prototype"]}}, [[[]]], {"a": [None, {"b": ""}]}]
BAD = [math.nan, math.inf, -math.inf, MAX_SAFE_INT + 1, -MAX_SAFE_INT - 1, 2**64, (1,), {1}, frozenset(),
       b"x", bytearray(b"x"), {1: 1}, {None: 1}, {("a",): 1}, Opaque(), datetime.datetime(2020, 1, 1),
       Color.RED, Name("x"), collections.OrderedDict(), "\ud800", {"\udc00": 1}, [1, [2, [math.nan]]],
       {"a": {"b": (1, 2)}}, 1 + 2j]


def test_reserved():
    assert RESERVED == frozenset({"__proto__", "constructor", "prototype"})


@pytest.mark.parametrize("value", GOOD, ids=repr)
def test_good_values(value):
    check_json_value(value)
    copied = copy_json_value(value)
    assert json_equal(copied, value)


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_bad_values(value):
    with pytest.raises(OpError) as info:
        check_json_value(value)
    assert info.value.kind == "value"
    with pytest.raises(OpError) as info:
        check_json_value(value, kind="type")
    assert info.value.kind == "type"


def test_error_names_the_location():
    with pytest.raises(OpError) as info:
        check_json_value({"a": [0, {"b": math.nan}]})
    assert "$['a'][1]['b']" in str(info.value)


def test_deep_and_cyclic_values():
    deep: list = []
    for _ in range(20_000):
        deep = [deep]
    check_json_value(deep)
    assert json_equal(copy_json_value(deep), deep)
    cyc: dict = {}
    cyc["self"] = {"again": cyc}
    with pytest.raises(OpError):
        check_json_value(cyc)


def test_copy_shares_strings_and_copies_containers():
    big = "x" * 1_000_000
    value = {"s": big, "l": [big, {"k": big}]}
    copied = copy_json_value(value)
    assert copied["s"] is big and copied["l"][1]["k"] is big
    assert copied["l"] is not value["l"] and copied["l"][1] is not value["l"][1]
    copied["l"].append(1)
    assert len(value["l"]) == 2


@pytest.mark.parametrize(
    "a, b, equal",
    [
        (1, 1, True),
        (1, True, False),
        (1, 1.0, False),
        (0.0, -0.0, False),
        (-0.0, -0.0, True),
        ([1, True], [1, True], True),
        ([1, True], [True, 1], False),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({"a": None}, {"b": None}, False),
        ({"a": [0.0]}, {"a": [-0.0]}, False),
        ("x", "x", True),
        ([], {}, False),
        (None, False, False),
    ],
)
def test_json_equal_is_strict(a, b, equal):
    assert json_equal(a, b) is equal
    assert json_equal(b, a) is equal


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-MAX_SAFE_INT, MAX_SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda ch: st.lists(ch, max_size=4) | st.dictionaries(st.text(max_size=3), ch, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_json_values_round_trip(value):
    check_json_value(value)
    assert json_equal(copy_json_value(value), value)
    assert json_equal(decode_json(encode_json(value)), value)


@pytest.mark.parametrize(
    "path, allow_empty, kind",
    [
        ([], False, "path"),
        ("a", False, "path"),
        (None, False, "path"),
        ({"a": 1}, False, "path"),
        (["a", True], False, "path"),
        (["a", -1], False, "path"),
        (["a", 1.5], False, "path"),
        (["a", None], False, "path"),
        (["a", MAX_SAFE_INT + 1], False, "path"),
        (["__proto__"], False, "reserved"),
        (("x", "prototype"), False, "reserved"),
        (["x", 0, "constructor"], False, "reserved"),
    ],
)
def test_bad_paths(path, allow_empty, kind):
    with pytest.raises(OpError) as info:
        check_path(path, allow_empty=allow_empty)
    assert info.value.kind == kind


def test_good_paths():
    check_path([], allow_empty=True)
    check_path(("a", 0, "", MAX_SAFE_INT, "Constructor", "__proto"))


@pytest.mark.parametrize(
    "op, kind",
    [
        (["r", 1], None),
        (("s", ("a",), 1), None),
        (["d", ["a"]], None),
        (["a", ["a"], "x"], None),
        (["t", ["a"], 1], None),
        (["p", [], 0, 0, []], None),
        ("s", "type"),
        ({"verb": "s"}, "type"),
        ([], "arity"),
        (["x", ["a"]], "verb"),
        (["#", 0, ["a"]], "verb"),
        ([None], "verb"),
        (["s", ["a"]], "arity"),
        (["p", ["a"], 0, 0], "arity"),
        (["s", [], 1], "path"),
        (["d", []], "path"),
        (["a", 0, "x"], "path"),
        (["t", ["prototype"], 1], "reserved"),
    ],
)
def test_validate_op(op, kind):
    if kind is None:
        validate_op(op)
    else:
        with pytest.raises(OpError) as info:
            validate_op(op)
        assert info.value.kind == kind


def test_op_error():
    err = OpError("range", "index 3 > length 2")
    assert isinstance(err, ValueError)
    assert err.kind == "range" and "index 3" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert again.kind == "range" and str(again) == str(err)
    assert set(OP_ERROR_KINDS) == {"verb", "arity", "path", "reserved", "type", "range", "missing", "ref", "value"}
    with pytest.raises(AssertionError):
        OpError("nonsense", "x")
