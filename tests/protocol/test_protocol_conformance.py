"""Every case of conformance/ops-v1.json (docs/OPS.md): apply, encode/decode/final, bad_wire.

The vectors are part of the repository. A missing file fails the run: an empty parametrization
must never pass.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from protocol import Decoder, Encoder, OpError, apply, is_base
from protocol.codec import decode_json, encode_json
from protocol.ops import json_equal


VECTORS_PATH = Path(__file__).resolve().parents[2] / "conformance" / "ops-v1.json"
VECTORS = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))  # FileNotFoundError fails collection
KINDS = {"verb", "arity", "path", "reserved", "type", "range", "missing", "ref"}


def _ids(cases):
    return [c["name"] for c in cases]


def test_vectors_are_there():
    assert VECTORS["version"] == 1
    assert len(VECTORS["apply"]) >= 50
    assert len(VECTORS["encode"]) >= 5
    assert len(VECTORS["bad_wire"]) >= 10
    for case in VECTORS["apply"] + VECTORS["bad_wire"]:
        assert ("error" in case) != ("expect" in case) or "wire" in case
        if "error" in case:
            assert case["error"] in KINDS


@pytest.mark.parametrize("case", VECTORS["apply"], ids=_ids(VECTORS["apply"]))
def test_apply(case):
    doc = copy.deepcopy(case["doc"])
    ops = copy.deepcopy(case["ops"])
    if "error" in case:
        with pytest.raises(OpError) as info:
            apply(doc, ops)
        assert info.value.kind == case["error"], str(info.value)
    else:
        result = apply(doc, ops)
        assert json_equal(result, case["expect"])
        assert result == case["expect"]
        assert ops == case["ops"], "apply must not modify the batch"


@pytest.mark.parametrize("case", VECTORS["apply"], ids=_ids(VECTORS["apply"]))
def test_apply_after_json_round_trip(case):
    """The same vectors, as a client sees them: decoded from JSON bytes by msgspec."""
    doc = decode_json(json.dumps(case["doc"]).encode())
    try:
        ops = decode_json(json.dumps(case["ops"]).encode())
    except Exception:  # an op value msgspec itself refuses (none today)
        pytest.fail("vector ops must be valid JSON")
    if "error" in case:
        with pytest.raises(OpError) as info:
            apply(doc, ops)
        assert info.value.kind == case["error"]
    else:
        assert apply(doc, ops) == case["expect"]


@pytest.mark.parametrize("case", VECTORS["encode"], ids=_ids(VECTORS["encode"]))
def test_encode(case):
    enc = Encoder()
    assert len(case["ops"]) == len(case["wire"])
    for ops, wire in zip(case["ops"], case["wire"]):
        assert enc.encode(copy.deepcopy(ops)) == wire


@pytest.mark.parametrize("case", VECTORS["encode"], ids=_ids(VECTORS["encode"]))
def test_encode_accepts_tuples(case):
    enc = Encoder()
    for ops, wire in zip(case["ops"], case["wire"]):
        as_tuples = [
            tuple(tuple(x) if i == 1 and op[0] != "r" else x for i, x in enumerate(op)) for op in ops
        ]
        assert enc.encode(as_tuples) == wire


@pytest.mark.parametrize("case", VECTORS["encode"], ids=_ids(VECTORS["encode"]))
def test_decode_and_final(case):
    dec = Decoder()
    doc = None
    for i, (ops, wire) in enumerate(zip(case["ops"], case["wire"])):
        decoded = dec.decode(decode_json(encode_json(wire)))
        assert decoded == ops
        assert is_base(decoded) == (ops[0][0] == "r")
        if i == 0:
            assert is_base(decoded), "the first batch of every stream is a base batch"
        doc = apply(doc, decoded)
    assert doc == case["final"]


@pytest.mark.parametrize("case", VECTORS["encode"], ids=_ids(VECTORS["encode"]))
def test_reader_may_start_at_any_base(case):
    """r resets the table: a fresh decoder can start at any base batch (OPS.md §3)."""
    starts = [i for i, ops in enumerate(case["ops"]) if is_base(ops)]
    assert starts and starts[0] == 0
    for start in starts:
        dec = Decoder()
        doc = None
        for wire in case["wire"][start:]:
            doc = apply(doc, dec.decode(wire))
        assert doc == case["final"]


@pytest.mark.parametrize("case", VECTORS["bad_wire"], ids=_ids(VECTORS["bad_wire"]))
def test_bad_wire(case):
    dec = Decoder()
    with pytest.raises(OpError) as info:
        for wire in case["wire"]:
            dec.decode(copy.deepcopy(wire))
    assert info.value.kind == case["error"], str(info.value)
