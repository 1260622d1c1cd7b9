"""Tracker: intent to minimal ops (OPS.md §5), checked end to end through the wire codec.

Every flush of every stream goes Tracker -> Encoder -> JSON bytes -> Decoder -> apply on a
mirror, and the mirror must equal ``tracker.value`` strictly (True != 1 != 1.0).
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import Decoder, Encoder, OpError, Tracker, apply, is_base
from protocol.codec import decode_json, encode_json
from protocol.ops import MAX_SAFE_INT, RESERVED, json_equal
from protocol.tracker import MAX_CANDIDATES, PROBE


class Opaque:
    """A class instance that is no JSON value, with a repr that is the same in every
    process (pytest-xdist workers must collect identical test ids)."""

    def __repr__(self) -> str:
        return "<Opaque>"


class Stream:
    """One producer and one consumer: tracker, encoder, decoder, mirror."""

    def __init__(self, initial=None):
        self.tr = Tracker(initial)
        self.enc = Encoder()
        self.dec = Decoder()
        self.mirror = None
        self.expect_base = True
        self.last_ops = None
        self.last_frozen = None
        self.batches = []

    def rebase(self):
        self.tr.rebase()
        self.expect_base = True

    def flush(self):
        ops = self.tr.flush()
        if self.last_ops is not None:  # ops already handed out never change afterwards
            assert encode_json(self.last_ops) == self.last_frozen
        if self.expect_base:
            assert len(ops) == 1 and is_base(ops)
        else:
            assert not any(op[0] == "r" for op in ops[1:])
        wire = decode_json(encode_json(self.enc.encode(ops)))
        decoded = self.dec.decode(wire)
        assert json_equal(decoded, ops)
        self.mirror = apply(self.mirror, decoded)
        assert json_equal(self.mirror, self.tr.value), (ops, self.mirror, self.tr.value)
        assert not self.tr.dirty
        assert self.tr.flush() == []
        self.expect_base = False
        self.last_ops, self.last_frozen = ops, encode_json(ops)
        self.batches.append(ops)
        return ops


def nodes(value):
    out = []
    stack = [((), value)]
    while stack:
        path, v = stack.pop()
        out.append((path, v))
        if type(v) is dict:  # reserved keys are fine inside values but not addressable
            stack.extend((path + (k,), x) for k, x in v.items() if k not in RESERVED)
        elif type(v) is list:
            stack.extend((path + (i,), x) for i, x in enumerate(v))
    return out


# --- the random stream property -------------------------------------------------------------------

KEYS = ["a", "b", "c", "d"]
ALPHABET = "ab\n😀é"
SCALARS = [None, True, False, 0, 1, -1, 1.0, 0.0, -0.0, 2.5, MAX_SAFE_INT, -MAX_SAFE_INT, "", "x"]


def make_text(seed: int) -> str:
    """A short text over a small alphabet (astral and non-ASCII included), from an int."""
    n, seed = seed % 7, seed // 7
    out = []
    for _ in range(n):
        out.append(ALPHABET[seed % len(ALPHABET)])
        seed //= len(ALPHABET)
    return "".join(out)


def make_value(seed: int):
    """A small nested JSON value from an int (hypothesis draws ints; this keeps examples cheap).

    Covers strictness traps (True/1/1.0, 0.0/-0.0) and reserved words as keys inside values.
    """
    rng = random.Random(seed)

    def build(depth):
        roll = rng.random()
        if depth >= 3 or roll < 0.45:
            return rng.choice(SCALARS) if rng.random() < 0.6 else make_text(rng.getrandbits(24))
        if roll < 0.75:
            return [build(depth + 1) for _ in range(rng.randrange(4))]
        keys = rng.sample(KEYS + ["__proto__"], rng.randrange(4))
        return {k: build(depth + 1) for k in keys}

    return build(0)


def make_initial(seed: int):
    if seed % 4 == 0:
        return {}
    if seed % 4 == 1:
        return []
    if seed % 4 == 2:
        return {"out": "", "l": [], "o": {"x": "abc"}}
    value = make_value(seed)
    return value if type(value) in (dict, list) else {"a": value}


actions = st.lists(
    st.tuples(st.integers(0, 20), st.integers(0, 2**16), st.integers(0, 2**16), st.integers(0, 2**40)),
    max_size=40,
)


def run_action(s: Stream, a, b, c, d):
    tr = s.tr
    text, value = make_text(d), make_value(d)
    all_nodes = nodes(tr.value)
    conts = [(p, v) for p, v in all_nodes if type(v) in (dict, list)]
    strs = [(p, v) for p, v in all_nodes if type(v) is str and p]
    lists = [(p, v) for p, v in all_nodes if type(v) is list]
    keyed = [(p + (k,), v[k]) for p, v in conts if type(v) is dict for k in v if k not in RESERVED]
    pick = lambda seq: seq[b % len(seq)]  # noqa: E731
    kind = a
    if kind in (0, 1, 2, 3):
        p, v = pick(conts)
        new = text if kind == 3 else value
        if type(v) is dict:
            tr.set(p + (KEYS[c % len(KEYS)],), new)
        else:
            tr.set(p + (c % (len(v) + 1),), new)
    elif kind == 4 and keyed:
        tr.delete(pick(keyed)[0])
    elif kind in (5, 6, 7) and strs:
        tr.append(pick(strs)[0], text)
    elif kind == 8 and strs:
        p, old = pick(strs)
        tr.set_text(p, old[c % (len(old) + 1):] + text)
    elif kind == 9 and strs:
        tr.set_text(pick(strs)[0], text)
    elif kind == 10 and lists:
        p, v = pick(lists)
        index = c % (len(v) + 1)
        remove = (c // 7) % (len(v) - index + 1)
        tr.splice(p, index, remove, [value, text][: 1 + c % 2])
    elif kind == 11 and lists:
        tr.push(pick(lists)[0], value)
    elif kind == 12 and lists:
        p, v = pick(lists)
        tr.insert(p, c % (len(v) + 1), text)
    elif kind == 13 and lists:
        p, v = pick(lists)
        if v:
            i = c % len(v)
            expected = v[i]
            assert tr.pop(p, i) is expected
    elif kind == 14 and lists:
        p, v = pick(lists)
        if v:
            tr.remove(p, v[c % len(v)])
    elif kind in (15, 16):
        s.flush()
    elif kind == 17:
        if b % 3 == 0:
            s.rebase()
        s.flush()
    elif kind == 18:
        reject(s, b, c, conts, lists, strs)
    elif kind == 19 and b % 4 == 0:
        tr.set([], value if type(value) in (dict, list) else {"a": value})


def reject(s: Stream, b, c, conts, lists, strs):
    """A bad call raises OpError and changes nothing (state and dirty set)."""
    tr = s.tr
    before = encode_json(tr.value)
    dirty_before = tr.statistics().dirty_paths
    p, v = conts[c % len(conts)]
    choice = b % 9
    with pytest.raises(OpError) as info:
        if choice == 0:
            tr.set(p + ("__proto__",), 1)
        elif choice == 1:
            tr.set(p + ((len(v) + 1) if type(v) is list else 0,), 1)
        elif choice == 2:
            tr.set(p + ((0 if type(v) is list else "k"),), [1, {"x": math.nan}])
        elif choice == 3:
            tr.delete(p + ("no such key",))
        elif choice == 4:
            tr.append(p, "x")  # a container, not a string
        elif choice == 5 and lists:
            lp, lv = lists[c % len(lists)]
            tr.splice(lp, len(lv) + 1, 0, ["x"])
        elif choice == 6 and strs:
            tr.set_text(strs[c % len(strs)][0], "\ud800")
        elif choice == 7 and lists:
            tr.pop(lists[c % len(lists)][0], 10**6)
        else:
            tr.set(p + ((True if type(v) is list else "k"),), (1, 2))
    assert info.value.kind in {"reserved", "range", "path", "value", "missing", "type"}
    assert encode_json(tr.value) == before
    assert tr.statistics().dirty_paths == dirty_before


@settings(
    max_examples=3000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.integers(0, 2**32), actions)
def test_random_streams_mirror_the_tracker(initial, steps):
    s = Stream(make_initial(initial))
    s.flush()
    for step in steps:
        run_action(s, *step)
    s.flush()
    assert s.tr.statistics().base_batches >= 1


# --- collapse -----------------------------------------------------------------------------------


def test_alternating_writes_to_two_paths_collapse():
    s = Stream({"log": "", "win": "".join(f"{i:05d}" for i in range(2000)), "n": 0})
    s.flush()
    for i in range(1000):
        s.tr.append(["log"], f"line {i}\n")
        s.tr.set_text(["win"], s.tr.value["win"][3:] + f"{i:03d}")
        s.tr.set(["n"], i)
    ops = s.flush()
    assert len(ops) <= 3 + 1  # a + t/a pair + s
    assert sorted(op[0] for op in ops) == ["a", "a", "s", "t"]
    for i in range(1000):
        s.tr.set(["n"], i)
        s.tr.set(["n"], str(i))
    assert s.flush() == [["s", ["n"], "999"]]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32))
def test_many_writes_to_two_paths_give_at_most_three_ops(seed):
    rng = random.Random(seed)
    s = Stream({"p": {"q": "start"}, "r": "", "n": 0})
    s.flush()
    writes = 1000 + rng.randrange(200)
    pair = rng.sample([("p", "q"), ("r",), ("n",)], 2)
    for i in range(writes):
        path = pair[i % 2]
        text = make_text(rng.getrandbits(32))
        if path == ("p", "q"):
            old = s.tr.value["p"]["q"]
            s.tr.set_text(path, old[rng.randrange(len(old) + 1):] + text)
        elif path == ("r",):
            s.tr.append(path, text)
        else:
            s.tr.set(path, rng.choice(SCALARS))
    assert len(s.flush()) <= 3


def test_list_writes_are_one_splice_never_one_set_per_index():
    s = Stream({"l": list(range(1000))})
    s.flush()
    s.tr.insert(["l"], 0, "front")
    assert s.flush() == [["p", ["l"], 0, 0, ["front"]]]
    s.tr.pop(["l"], 0)
    assert s.flush() == [["p", ["l"], 0, 1, []]]
    s.tr.remove(["l"], 500)
    assert s.flush() == [["p", ["l"], 500, 1, []]]
    for i in range(100):
        s.tr.push(["l"], i)
    ops = s.flush()
    assert ops == [["p", ["l"], 999, 0, list(range(100))]]
    s.tr.splice(["l"], 10, 5, ["a", "b"])
    assert s.flush() == [["p", ["l"], 10, 5, ["a", "b"]]]
    s.tr.set(["l", 3], "three")
    assert s.flush() == [["s", ["l", 3], "three"]]
    s.tr.set(["l", len(s.tr.value["l"])], "end")
    assert s.flush() == [["p", ["l"], len(s.tr.value["l"]) - 1, 0, ["end"]]]


def test_root_list_tracker_splices_the_root():
    s = Stream([])
    assert s.flush() == [["r", []]]
    s.tr.push([], {"a": 1})
    s.tr.push((), 2)
    assert s.flush() == [["p", [], 0, 0, [{"a": 1}, 2]]]
    s.tr.set([0, "a"], 5)
    assert s.flush() == [["s", [0, "a"], 5]]


# --- text ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "old, new, expect",
    [
        ("abc", "abcdef", [["a", ["t"], "def"]]),
        ("abcdefgh", "efgh!!!", [["t", ["t"], 4], ["a", ["t"], "!!!"]]),
        ("abcdef", "def", [["t", ["t"], 3]]),
        ("abc", "xyz", [["s", ["t"], "xyz"]]),
        ("abc", "ab", [["s", ["t"], "ab"]]),
        ("abc", "", [["s", ["t"], ""]]),
        ("", "x", [["a", ["t"], "x"]]),
        ("a😀b😀", "b😀c", [["t", ["t"], 2], ["a", ["t"], "c"]]),
        ("x" * 100 + "y" * 100, "y" * 100 + "z", [["t", ["t"], 100], ["a", ["t"], "z"]]),
        ("abab", "ababab", [["a", ["t"], "ab"]]),
        ("0123456789" * 10, ("0123456789" * 10)[37:] + "tail", [["t", ["t"], 37], ["a", ["t"], "tail"]]),
    ],
)
def test_set_text(old, new, expect):
    s = Stream({"t": old})
    s.flush()
    s.tr.set_text(["t"], new)
    assert s.flush() == expect


def test_overlap_prefers_the_smallest_drop():
    # "aaaa" -> "aaab": overlaps "aaa" (drop 1) and shorter ones; the longest wins
    s = Stream({"t": "aaaa"})
    s.flush()
    s.tr.set_text(["t"], "aaab")
    assert s.flush() == [["t", ["t"], 1], ["a", ["t"], "b"]]


def test_repetitive_log_through_a_window_is_linear():
    """The same line 10,000 times, arriving in odd-sized chunks, tailed through a 50 KB window."""
    line = "the same line of build output, again\n"
    log = line * 10_000
    window = 50_000
    s = Stream({"out": ""})
    s.flush()
    pos, steps, slides, sizes = 0, 0, 0, 0
    while pos < len(log):
        pos = min(len(log), pos + 1 + (steps * 131) % 389)
        text = log[max(0, pos - window):pos]
        steps += 1
        unchanged = text == s.tr.value["out"]  # a whole number of periods: same window
        s.tr.set_text(["out"], text)
        ops = s.tr.flush()
        if unchanged:
            assert ops == []
            continue
        assert ops[0][0] in ("a", "t") and len(ops) <= 2
        if ops[0][0] == "t":
            slides += 1
            assert [op[0] for op in ops] == ["t", "a"]
        s.mirror = apply(s.mirror, s.dec.decode(s.enc.encode(ops)))
        sizes += len(text)
    assert s.mirror == {"out": log[-window:]}
    stats = s.tr.statistics()
    assert slides > 1000
    assert stats.text_fallbacks == 0
    # one verified candidate per slide, and each verification reads at most one window:
    assert stats.text_candidates <= slides
    assert stats.text_chars_compared <= sizes


def test_adversarial_text_is_bounded_and_falls_back_to_set():
    old = "a" * 50_000 + "x"
    new = "a" * 50_000 + "y"
    s = Stream({"t": old})
    s.flush()
    s.tr.set_text(["t"], new)
    assert s.flush() == [["s", ["t"], new]]
    stats = s.tr.statistics()
    assert stats.text_fallbacks == 1
    assert stats.text_candidates <= MAX_CANDIDATES + PROBE - 1
    assert stats.text_chars_compared <= (MAX_CANDIDATES + PROBE) * len(old)
    # probe hits whose verification fails are bounded, and a shorter verified overlap still wins
    s.tr.set_text(["t"], "a" * 50_000)
    s.flush()
    before = s.tr.statistics()
    s.tr.set_text(["t"], "a" * 100 + "b" + "a" * 49_000)
    ops = s.flush()
    after = s.tr.statistics()
    assert [op[0] for op in ops] == ["t", "a"] and s.mirror["t"] == s.tr.value["t"]
    assert after.text_candidates - before.text_candidates <= MAX_CANDIDATES + PROBE - 1
    assert after.text_fallbacks == before.text_fallbacks


# --- values, paths, errors ------------------------------------------------------------------------


def test_first_flush_is_base_and_rebase_forces_one():
    tr = Tracker({"a": 1})
    assert tr.dirty
    assert tr.flush() == [["r", {"a": 1}]]
    assert not tr.dirty and tr.flush() == []
    tr.set(["a"], 2)
    tr.rebase()
    assert tr.flush() == [["r", {"a": 2}]]
    assert Tracker().flush() == [["r", {}]]
    st_ = tr.statistics()
    assert (st_.base_batches, st_.flushes) == (2, 3)


def test_writes_that_cancel_out_give_no_ops():
    tr = Tracker({"a": "x", "l": [1]})
    tr.flush()
    tr.set(["a"], "y")
    tr.set(["a"], "x")
    tr.push(["l"], 2)
    tr.pop(["l"])
    tr.set(["new"], 1)
    tr.delete(["new"])
    assert tr.dirty
    assert tr.flush() == []


def test_strict_equality_in_diffs():
    s = Stream({"v": 1, "f": 0.0, "l": [1, True]})
    s.flush()
    s.tr.set(["v"], True)
    s.tr.set(["f"], -0.0)
    s.tr.set(["l"], [True, 1])
    ops = s.flush()
    assert ["s", ["v"], True] in ops
    assert ["s", ["f"], -0.0] in ops and math.copysign(1, [o for o in ops if o[1] == ["f"]][0][2]) == -1
    assert type(s.mirror["v"]) is bool and s.mirror["l"] == [True, 1] and type(s.mirror["l"][0]) is bool
    s.tr.set(["v"], 1.0)
    assert s.flush() == [["s", ["v"], 1.0]] and type(s.mirror["v"]) is float


def test_deep_writes_then_ancestor_writes_absorb_correctly():
    s = Stream({"a": {"b": {"c": "x", "d": [1, 2]}, "e": 1}})
    s.flush()
    s.tr.append(["a", "b", "c"], "y")
    s.tr.set(["a", "b", "d", 0], 9)
    s.tr.set(["a", "b", "new"], {"k": 1})
    s.tr.delete(["a", "e"])
    s.tr.set(["a", "b"], {"c": "xyz", "d": [9, 2], "z": None})
    s.tr.append(["a", "b", "c"], "!")
    ops = s.flush()
    assert s.mirror == s.tr.value
    assert sorted(ops) == sorted([["s", ["a", "b", "z"], None], ["a", ["a", "b", "c"], "yz!"], ["s", ["a", "b", "d", 0], 9], ["d", ["a", "e"]]])
    s.tr.delete(["a", "b"])
    s.tr.set(["a", "b"], "gone")
    assert s.flush() == [["s", ["a", "b"], "gone"]]


def test_values_are_copied_on_record_and_ops_never_alias_state():
    tr = Tracker()
    tr.flush()
    item = {"k": [1]}
    tr.set(["x"], item)
    item["k"].append(2)
    assert tr.value == {"x": {"k": [1]}}
    ops = tr.flush()
    ops[0][2]["k"].append("from caller")
    assert tr.value == {"x": {"k": [1]}}
    tr.push(["x", "k"], 3)
    assert ops[0][2] == {"k": [1, "from caller"]}
    base = Tracker({"l": [[1]]}).flush()
    assert base == [["r", {"l": [[1]]}]]


BAD_CALLS = [
    ("set", (["__proto__"], 1), "reserved"),
    ("set", (["o", "constructor", "x"], 1), "reserved"),
    ("set", (["x"], math.nan), "value"),
    ("set", (["x"], math.inf), "value"),
    ("set", (["x"], MAX_SAFE_INT + 1), "value"),
    ("set", (["x"], (1, 2)), "value"),
    ("set", (["x"], {1: 2}), "value"),
    ("set", (["x"], {"ok": {b"k"}}), "value"),
    ("set", (["x"], Opaque()), "value"),
    ("set", (["x"], "\udfff"), "value"),
    ("set", (["l", 5], 1), "range"),
    ("set", (["l", True], 1), "path"),
    ("set", (["l", "0"], 1), "path"),
    ("set", (["o", 0], 1), "path"),
    ("set", (["t", "x"], 1), "path"),
    ("set", (["nope", "x"], 1), "missing"),
    ("set", ("o", 1), "path"),
    ("set", ([], 5), "type"),
    ("delete", (["nope"],), "missing"),
    ("delete", (["l", 0],), "type"),
    ("delete", ([],), "path"),
    ("append", (["l"], "x"), "type"),
    ("append", (["t"], 5), "type"),
    ("append", (["t"], "\ud800"), "value"),
    ("append", (["nope"], "x"), "missing"),
    ("set_text", (["o"], "x"), "type"),
    ("set_text", (["t"], None), "type"),
    ("splice", (["l"], 4, 0, []), "range"),
    ("splice", (["l"], 0, 4, []), "range"),
    ("splice", (["l"], -1, 0, []), "type"),
    ("splice", (["l"], True, 0, []), "type"),
    ("splice", (["l"], 0, 0, "abc"), "type"),
    ("splice", (["l"], 0, 0, [math.nan]), "value"),
    ("splice", (["o"], 0, 0, [1]), "type"),
    ("push", (["t"], 1), "type"),
    ("push", (["l"], {1, 2}), "value"),
    ("insert", (["l"], 9, 1), "range"),
    ("pop", (["l"], 3), "range"),
    ("pop", (["l"], -4), "range"),
    ("pop", (["l"], True), "type"),
    ("pop", (["o"],), "type"),
    ("remove", (["l"], 99), "missing"),
    ("remove", (["l"], True), "missing"),
]


@pytest.mark.parametrize("method, args, kind", BAD_CALLS, ids=lambda x: repr(x)[:40])
def test_rejected_call_changes_nothing(method, args, kind):
    tr = Tracker({"l": [1, 2, 3], "o": {"a": 1}, "t": "text"})
    tr.flush()
    before = encode_json(tr.value)
    with pytest.raises(OpError) as info:
        getattr(tr, method)(*args)
    assert info.value.kind == kind, str(info.value)
    assert encode_json(tr.value) == before
    assert not tr.dirty
    assert tr.flush() == []


def test_convenience_methods_return_values():
    tr = Tracker({"l": ["a", "b", "c"]})
    tr.flush()
    assert tr.pop(["l"]) == "c"
    assert tr.pop(["l"], 0) == "a"
    assert tr.splice(["l"], 0, 1, ["x", "y"]) == ["b"]
    tr.remove(["l"], "x")
    assert tr.value == {"l": ["y"]}
    assert tr.flush() == [["p", ["l"], 0, 3, ["y"]]]


def test_initial_value_is_checked_and_copied():
    init = {"a": [1]}
    tr = Tracker(init)
    init["a"].append(2)
    assert tr.value == {"a": [1]}
    with pytest.raises(OpError) as info:
        Tracker({"a": math.nan})
    assert info.value.kind == "value"
    with pytest.raises(OpError):
        Tracker("text")
