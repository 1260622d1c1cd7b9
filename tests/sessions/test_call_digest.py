"""The call digest behind ``CALL_ID_REUSED`` compares numbers by value (OPS.md §1: ``1`` and
``1.0`` are the same JSON number), and digests made before that rule stay valid."""

from __future__ import annotations

import pytest

from dshd import errors
from dshd.sessions.call_index import KnownCalls, call_digest, legacy_digest


def test_integral_floats_digest_as_their_integers():
    base = {"command": "sleep 1", "timeout": 5}
    assert call_digest("bash", base) == call_digest("bash", {**base, "timeout": 5.0})
    assert call_digest("bash", base) == call_digest("bash", '{"command":"sleep 1","timeout":5.0}')
    assert call_digest("bash", base) == call_digest("bash", '{"timeout":5e0,"command":"sleep 1"}')
    nested = {"command": "x", "a": [1.0, {"b": -0.0}]}
    assert call_digest("bash", nested) == call_digest("bash", {"command": "x", "a": [1, {"b": 0}]})
    assert call_digest("bash", base) != call_digest("bash", {**base, "timeout": 5.5})
    assert call_digest("bash", {"t": 1e300}) != 0  # huge floats stay floats, no overflow
    # arguments without integral floats digest as before (the logged digests stay valid)
    plain = {"command": "echo hi", "env": {"A": "b"}, "timeout": 2.5}
    assert call_digest("bash", plain) == legacy_digest("bash", plain)


def test_a_digest_logged_before_the_rule_still_answers_its_retry():
    known = KnownCalls(capacity=4)
    old = legacy_digest("bash", {"command": "x", "timeout": 5.0})
    assert old != call_digest("bash", {"command": "x", "timeout": 5.0})
    known.propose("k1", "bash", old)
    known.check_reuse("k1", "bash", {"command": "x", "timeout": 5.0})  # the same: no error
    known.propose("k2", "bash", call_digest("bash", {"command": "x", "timeout": 5}))
    known.check_reuse("k2", "bash", {"command": "x", "timeout": 5.0})
    with pytest.raises(errors.InvalidParams) as other:
        known.check_reuse("k2", "bash", {"command": "x", "timeout": 6})
    assert other.value.data["code"] == "CALL_ID_REUSED"
