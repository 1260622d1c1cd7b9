"""The bounded call memory of a session (``dshd.sessions.call_index``): exact, compact, bounded.

Pure tests (no daemon): the index answers every id it was given, and only those, through the
freezes and its snapshot form; the results cache never holds more than its capacity."""

from __future__ import annotations

import json
import random

import pytest
import trio

from dshd.sessions.call_index import (
    FREEZE_MIN, SETTLED_ELSEWHERE, UNSETTLED, CallIndex, KnownCalls, ResultCache,
)


def _ids(n: int, rng: random.Random) -> list[str]:
    # both shapes the daemon sees: minted (m-<16 hex>, c-<12 hex>) and a client's own names
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append("m-" + "%016x" % rng.getrandbits(64))
        elif kind == 1:
            out.append("c-" + "%012x" % rng.getrandbits(48))
        else:
            out.append(f"job_{i}-x")
    return out


def test_index_is_exact_through_freezes_and_its_snapshot_form() -> None:
    rng = random.Random(7)
    ids = _ids(3 * FREEZE_MIN, rng)
    index = CallIndex()
    truth: dict[str, int] = {}
    for seq, cid in enumerate(ids):
        index.add(cid)
        truth[cid] = UNSETTLED
        if seq % 7:  # most settle, some stay open
            index.settle(cid, 10 * seq)
            truth[cid] = 10 * seq
    index.add(ids[1])  # a known id keeps its seq
    assert len(index) == len(truth)
    assert all(index.get(cid) == seq for cid, seq in truth.items())
    for probe in ("m-0000000000000000", "nope", ids[0] + "x", ids[0][:-1], "é"):
        assert probe not in index
    assert index._frozen and len(index._frozen) > FREEZE_MIN  # the freeze ran
    again = CallIndex.from_json(json.loads(json.dumps(index.to_json())))
    assert all(again.get(cid) == seq for cid, seq in truth.items())
    assert "nope" not in again and len(again) == len(truth)
    # settling a frozen id after the restore changes only that id
    frozen_open = next(cid for cid in ids if truth[cid] != UNSETTLED)
    again.settle(frozen_open, 5)
    assert again.get(frozen_open) == 5


def test_index_costs_few_bytes_per_call() -> None:
    index = CallIndex()
    n = 8 * FREEZE_MIN
    for seq, cid in enumerate(_ids(n, random.Random(3))):
        index.add(cid)
        index.settle(cid, seq)
    # the frozen level is id + 13 bytes; the dict level (< a quarter of it) about 130
    assert index.nbytes() / n < 60, index.nbytes() / n


@pytest.mark.parametrize("damage", [
    {"ids": "a\n", "starts": "", "seqs": ""},
    {"ids": 1, "starts": "", "seqs": "", "recent": {}},
    {"ids": "", "starts": "", "seqs": "", "recent": {"a": "x"}},
    {"ids": "", "starts": "!!", "seqs": "", "recent": {}},
])
def test_a_damaged_snapshot_index_is_refused(damage) -> None:
    with pytest.raises(ValueError):
        CallIndex.from_json(damage)


def test_results_cache_is_an_lru_of_its_capacity() -> None:
    cache = ResultCache(3)
    for i in range(10):
        cache.put(f"c{i}", {"n": i})
    assert len(cache) == 3 and cache.get("c0") is None
    cache.get("c7")  # used: the next put drops c8, not c7
    cache.put("c10", {"n": 10})
    assert "c7" in cache and "c8" not in cache


async def test_known_calls_keep_nothing_per_settled_call_but_the_index() -> None:
    read: list[tuple[str, int]] = []

    async def from_disk(call_id: str, seq: int) -> dict:
        read.append((call_id, seq))
        return {"callId": call_id, "seq": seq}

    known = KnownCalls(16, from_disk)
    for i in range(500):
        cid = f"c{i}"
        known.called(cid, "bash", {"seq": 2 * i, "time": 0, "data": {"callId": cid}})
        waiter = known.waiter(cid)
        known.settled(cid, 2 * i + 1, {"callId": cid})
        known.wake(cid)
        assert waiter.is_set()
    stats = known.statistics()
    assert stats == {**stats, "known": 500, "cached": 16, "unsettled": 0, "waiters": 0,
                     "logged": 0}
    assert await known.result("c499") == {"callId": "c499"} and not read  # cached
    assert await known.result("c3") == {"callId": "c3", "seq": 7}  # from "disk", by seq
    assert read == [("c3", 7)]
    assert known.settled_result("c4") is SETTLED_ELSEWHERE
    known.propose("m-1", "bash")
    assert known.settled_result("m-1") is None and "m-1" in known
    with trio.move_on_after(0):
        await known.waiter("m-1").wait()  # not settled: nobody wakes it
    assert not known.waiter("m-1").is_set()
