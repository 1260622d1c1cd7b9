"""The call index in the snapshot chain (``dshd.sessions.chain``, STORAGE.md §7): each
``log/snapshot`` carries only the entries changed since the previous one, an open folds the
whole chain, the bytes stay proportional to the log, damage is never a wrong index.

Real ``SessionLog`` files with real fsync. The owner's dict is made by
``Session.snapshot_state`` itself, on a stand-in holding only what that method reads."""

from __future__ import annotations

import random
from types import SimpleNamespace

from dshd.sessions.rules import RuleBook

import pytest
import zstandard

from dshd.sessions.call_index import UNSETTLED, CallIndex
from dshd.sessions.session import Session
from dshd.storage import LogCorrupt, SessionLog
from dshd.storage.format import Header, TRAILER_SIZE
from dshd.storage.pages import iter_all

SID = "s1"


def _owner(log: SessionLog, index: CallIndex) -> SimpleNamespace:
    """What ``Session.snapshot_state`` reads, with a real index."""
    return SimpleNamespace(_log=log, _calls=SimpleNamespace(known=SimpleNamespace(index=index)),
                           _lane=SimpleNamespace(tracker=SimpleNamespace(value={"recent": []})),
                           _approvals=SimpleNamespace(decided={}, rules=RuleBook()), _logged_env={})


def _attach(log: SessionLog, index: CallIndex) -> None:
    owner = _owner(log, index)
    log.set_snapshot_state(lambda: Session.snapshot_state(owner))


def _truth(state_dir) -> dict[str, int]:
    """The index of the whole history: every event of the log folded from seq 0."""
    out: dict[str, int] = {}
    for ev in iter_all(state_dir / "sessions" / SID, SID):
        if ev.type == "tool/call":
            out.setdefault(ev.data["callId"], UNSETTLED)
        elif ev.type == "tool/result":
            out[ev.data["callId"]] = ev.seq
    return out


def _reopened_index(log: SessionLog) -> CallIndex:
    """What the registry gives a reopened session: the chain's index, then the tail."""
    from dshd.sessions.chain import read_index

    index = read_index(log.session_dir, SID, log.snapshot_offset, log.snapshot_seq,
                       log.durable_bytes)
    for ev in log.tail:
        if ev.type == "tool/call":
            index.add(ev.data["callId"])
        elif ev.type == "tool/result":
            index.add(ev.data["callId"])
            index.settle(ev.data["callId"], ev.seq)
    return index


async def _session_ops(log: SessionLog, index: CallIndex, rng: random.Random, n: int,
                       open_calls: list[str], prefix: str, output: str = "") -> None:
    for i in range(n):
        r = rng.random()
        if (r < 0.45 or not open_calls) and len(open_calls) < 16:
            cid = f"{prefix}-{i}-{rng.getrandbits(32):08x}"
            log.append("tool/call", {"callId": cid, "name": "bash", "arguments": "{}"})
            index.add(cid)
            open_calls.append(cid)
        elif r < 0.9 or len(open_calls) >= 16:
            cid = open_calls.pop(rng.randrange(len(open_calls)))
            seq = log.append("tool/result", {"callId": cid, "isError": False,
                                             "content": output or f"out {i}",
                                             "details": {}}).seq
            index.settle(cid, seq)
        else:
            log.append("message/user", {"turnId": "t", "text": f"note {i}"})
        if rng.random() < 0.3:
            await log.flush()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_index_after_open_is_the_index_of_the_whole_history(tmp_path, seed):
    rng = random.Random(seed)
    header = Header(id=SID, createdAt=1, cwd="/w", title=None)
    log = SessionLog.create(tmp_path, SID, header, snapshot_every=7)
    index = CallIndex()
    _attach(log, index)
    open_calls: list[str] = []
    for restart in range(4):
        await _session_ops(log, index, rng, 300, open_calls, f"r{restart}")
        await log.aclose()
        log = await SessionLog.open_for_write(tmp_path, SID, snapshot_every=7)
        assert log.snapshot_offset is not None and log.snapshot_seq > 0
        index = _reopened_index(log)
        assert index.entries() == _truth(tmp_path), (seed, restart)
        _attach(log, index)
    # and a last stretch whose tail is not followed by a snapshot (a crash, not a close)
    await _session_ops(log, index, rng, 50, open_calls, "last")
    await log.flush()
    log.set_snapshot_state(None)
    await log.aclose()
    again = await SessionLog.open_for_write(tmp_path, SID, snapshot_every=7)
    try:
        assert _reopened_index(again).entries() == _truth(tmp_path)
    finally:
        await again.aclose()


def test_a_delta_handed_to_a_snapshot_never_written_is_repeated() -> None:
    index = CallIndex()
    index.add("a")
    assert index.delta(-1, 10) == {"a": UNSETTLED}
    index.settle("a", 11)
    index.add("b")
    # the snapshot at 10 never became durable: the next one (prev: none) repeats "a"
    assert index.delta(-1, 20) == {"a": 11, "b": UNSETTLED}
    index.add("c")
    # the one at 20 is durable now: only what changed after it
    assert index.delta(20, 30) == {"c": UNSETTLED}
    assert index.delta(30, 40) == {}


def _snapshot_frame_bytes(log_path) -> tuple[int, int, list[int]]:
    """(bytes of every snapshot frame with its trailer, log bytes, snapshot offsets),
    walking back over trailers."""
    data = log_path.read_bytes()
    dctx = zstandard.ZstdDecompressor()
    pos, snaps, offsets = len(data), 0, []
    while pos > TRAILER_SIZE:
        length = int.from_bytes(data[pos - TRAILER_SIZE + 8: pos - TRAILER_SIZE + 12], "little")
        start = pos - TRAILER_SIZE - length
        if start <= 0:
            break
        head = dctx.decompressobj().decompress(data[start: pos - TRAILER_SIZE])[:200]
        if b'"type":"log/snapshot"' in head:
            snaps += pos - start
            offsets.append(start)
        pos = start
    return snaps, len(data), offsets


async def test_snapshot_bytes_stay_a_fraction_of_the_log_however_many_calls(tmp_path):
    rng = random.Random(5)
    header = Header(id=SID, createdAt=1, cwd="/w", title=None)
    log = SessionLog.create(tmp_path, SID, header, snapshot_every=100)
    index = CallIndex()
    _attach(log, index)
    # ~6,000 calls in ~13,000 events, a short output each: 130 snapshots
    out = "".join(f"[{k}/4] cc -c src/m{k}.c\n" for k in range(4))
    await _session_ops(log, index, rng, 6_500, [], "c", output=out)
    [path] = list((tmp_path / "sessions" / SID).glob("session.v*.jsonl.zst"))
    half_snaps, half_total, half_offsets = _snapshot_frame_bytes(path)
    await _session_ops(log, index, rng, 6_500, [], "d", output=out)
    await log.aclose()
    snaps, total, offsets = _snapshot_frame_bytes(path)
    assert len(offsets) >= 100
    # A whole index in every snapshot made them 6x the rest of the log here, growing with
    # every call; a delta is a fixed share of what the calls themselves write.
    assert snaps <= 0.25 * total, (snaps, total)
    per_snapshot_first = half_snaps / len(half_offsets)
    per_snapshot_second = (snaps - half_snaps) / (len(offsets) - len(half_offsets))
    assert per_snapshot_second <= 1.3 * per_snapshot_first, (per_snapshot_first,
                                                             per_snapshot_second)


async def _damaged_log(tmp_path, *, also_the_frame_before: bool):
    header = Header(id=SID, createdAt=1, cwd="/w", title=None)
    log = SessionLog.create(tmp_path, SID, header, snapshot_every=20)
    index = CallIndex()
    _attach(log, index)
    await _session_ops(log, index, random.Random(9), 400, [], "c")
    await log.aclose()
    truth = _truth(tmp_path)
    [path] = list((tmp_path / "sessions" / SID).glob("session.v*.jsonl.zst"))
    _, _, offsets = _snapshot_frame_bytes(path)
    old = offsets[len(offsets) // 2]  # newest first: one in the middle of the chain
    data = bytearray(path.read_bytes())
    data[old + 20] ^= 0x40
    if also_the_frame_before:
        data[old - TRAILER_SIZE - 8] ^= 0x40  # inside the frame before it
    path.write_bytes(bytes(data))
    # the open itself reads from the last snapshot on: it does not see the damage
    return await SessionLog.open_for_write(tmp_path, SID, snapshot_every=20), truth, old


async def test_a_damaged_old_snapshot_loses_only_its_delta_rebuilt_from_its_events(tmp_path):
    log, truth, _ = await _damaged_log(tmp_path, also_the_frame_before=False)
    try:
        assert _reopened_index(log).entries() == truth
    finally:
        await log.aclose()


async def test_a_delta_that_cannot_be_rebuilt_refuses_the_open_never_a_short_index(tmp_path):
    from dshd.sessions.chain import read_index

    log, _, old = await _damaged_log(tmp_path, also_the_frame_before=True)
    try:
        # the frames before the snapshot do not check either, and the full read that would
        # replace the chain finds the damage: no index at all rather than a short one
        with pytest.raises(LogCorrupt) as caught:
            read_index(log.session_dir, SID, log.snapshot_offset, log.snapshot_seq,
                       log.durable_bytes)
        assert caught.value.offset < old
    finally:
        await log.aclose()
