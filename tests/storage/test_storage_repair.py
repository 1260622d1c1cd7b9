"""Crash repair and pending-output sidecars (STORAGE.md §5, §6)."""

from __future__ import annotations

import copy
import os
import stat

import pytest

from dshd.storage import (
    Event,
    PendingOutput,
    SessionLog,
    StorageWriteError,
    read_log,
    read_pending_window,
    repair_closers,
)
from dshd.storage.repair import (
    NOT_GRANTED_TEXT,
    NOT_STARTED_TEXT,
    OUTCOME_UNKNOWN_TEXT,
    unresolved_calls,
)
from dshd.storage.sidecar import BASE_EVERY, pending_path, retire_settled
from protocol.apply import apply
from protocol.codec import Encoder
from storage_helpers import make_header

TRUNC = {"truncated": False, "truncatedBy": None, "totalBytes": 0, "totalLines": 0,
         "maxBytes": 51200, "maxLines": 2000}

#: details.truncation of a repaired call with no checkpointed window (PROTOCOL.md §3.2).
ZERO_TRUNCATION = {"truncated": False, "truncatedBy": None, "totalBytes": 0, "totalLines": 0,
                   "maxBytes": 51_200, "maxLines": 2_000}


def events_of(pairs: list[tuple[str, dict]]) -> list[Event]:
    return [Event(seq=i, time=1, type=t, data=d) for i, (t, d) in enumerate(pairs)]


CRASHED = [
    ("turn/start", {"turnId": "T0"}),
    ("turn/end", {"turnId": "T0", "reason": "completed"}),
    ("turn/start", {"turnId": "T1"}),
    ("step/start", {"turnId": "T1", "stepId": "S0"}),
    ("step/end", {"turnId": "T1", "stepId": "S0"}),
    ("step/start", {"turnId": "T1", "stepId": "S1"}),
    ("message/assistant", {"turnId": "T1", "text": "", "toolCalls": [
        {"callId": "c1", "name": "bash", "arguments": "{}"},
        {"callId": "c2", "name": "bash", "arguments": "{}"},
        {"callId": "c3", "name": "bash", "arguments": "{}"},
        {"callId": "c4", "name": "bash", "arguments": "{}"},
    ]}),
    ("tool/call", {"callId": "c1", "name": "bash", "arguments": "{}", "turnId": "T1"}),
    ("approval/asked", {"approvalId": "a1", "callId": "c1", "tool": "bash", "summary": "ls"}),
    ("approval/decided", {"approvalId": "a1", "outcome": "allowed-once", "by": "caller"}),
    ("tool/call", {"callId": "c3", "name": "bash", "arguments": "{}", "turnId": "T1"}),
    ("tool/result", {"callId": "c3", "isError": False, "content": "ok", "details": {}}),
    ("tool/call", {"callId": "c4", "name": "bash", "arguments": "{}", "turnId": "T1"}),
    ("approval/asked", {"approvalId": "a2", "callId": "c4", "tool": "bash", "summary": "rm"}),
]

EXPECTED = [
    ("approval/decided", {"approvalId": "a2", "outcome": "cancelled", "by": "repair"}),
    ("tool/result", {"callId": "c1", "isError": True, "content": OUTCOME_UNKNOWN_TEXT,
                     "details": {"truncation": ZERO_TRUNCATION}, "errorCode": "TOOL_OUTCOME_UNKNOWN"}),
    ("tool/result", {"callId": "c2", "isError": True, "content": NOT_STARTED_TEXT,
                     "details": {"truncation": ZERO_TRUNCATION}, "errorCode": "TOOL_NOT_STARTED"}),
    # c4 waited for approval and was never granted: it cannot have started.
    ("tool/result", {"callId": "c4", "isError": True, "content": NOT_GRANTED_TEXT,
                     "details": {"truncation": ZERO_TRUNCATION}, "errorCode": "TOOL_NOT_STARTED"}),
    ("step/end", {"turnId": "T1", "stepId": "S1"}),
    ("turn/end", {"turnId": "T1", "reason": "interrupted"}),
]


def test_repair_closers_each_kind_in_order():
    assert repair_closers(events_of(CRASHED), {}) == EXPECTED
    assert unresolved_calls(events_of(CRASHED)) == ["c1", "c4"]


def test_repair_closers_is_idempotent_and_quiet_on_clean_logs():
    repaired = events_of([*CRASHED, *EXPECTED])
    assert repair_closers(repaired, {}) == []
    assert repair_closers([], {}) == []
    assert repair_closers(events_of(CRASHED[:2]), {}) == []


def test_repair_closers_nesting_order():
    pairs = [
        ("turn/start", {"turnId": "A"}),
        ("step/start", {"turnId": "A", "stepId": "1"}),
        ("turn/start", {"turnId": "B"}),
        ("step/start", {"turnId": "B", "stepId": "1"}),
        ("approval/asked", {"approvalId": "x", "callId": "k", "tool": "t", "summary": ""}),
        ("approval/asked", {"approvalId": "y", "callId": "k", "tool": "t", "summary": ""}),
    ]
    assert [(t, d.get("approvalId") or d.get("stepId") or d.get("turnId"), d.get("turnId"))
            for t, d in repair_closers(events_of(pairs))] == [
        ("approval/decided", "x", None),
        ("approval/decided", "y", None),
        ("step/end", "1", "B"),
        ("step/end", "1", "A"),
        ("turn/end", "B", "B"),
        ("turn/end", "A", "A"),
    ]


def test_repair_closers_with_pending_windows():
    window = {"content": [{"type": "text", "text": "partial output\n"}],
              "details": {"spillPath": "/s/spill/c1.log"},
              "truncation": {**TRUNC, "truncated": True, "truncatedBy": "bytes"}}
    closers = dict((d.get("callId"), d) for t, d in repair_closers(
        events_of(CRASHED), {"c1": window, "c4": "plain text window"}) if t == "tool/result")
    c1 = closers["c1"]
    assert c1["content"].startswith(OUTCOME_UNKNOWN_TEXT) and c1["content"].endswith("partial output\n")
    assert c1["details"] == {"truncation": window["truncation"], "spillPath": "/s/spill/c1.log"}
    # c4 was never granted, so a window for it cannot be real output: it is not used.
    assert closers["c4"]["errorCode"] == "TOOL_NOT_STARTED"
    assert "plain text window" not in closers["c4"]["content"]
    assert closers["c2"]["content"] == NOT_STARTED_TEXT  # windows only for started calls


async def checkpoint_output(session_dir, call_id: str, texts: list[str]) -> dict:
    """Checkpoint a growing ToolOutput through the sidecar; return the final value."""
    enc = Encoder()
    pending = PendingOutput(session_dir, call_id)
    doc = None
    for i, text in enumerate(texts):
        if pending.needs_base:
            value = {"content": [{"type": "text", "text": text}], "details": {}, "truncation": TRUNC}
            ops = [["r", value]]
            if i:  # a base batch carries the whole state so far
                value["content"][0]["text"] = doc["content"][0]["text"] + text
        else:
            ops = [["a", ["content", 0, "text"], text],
                   ["s", ["truncation", "totalBytes"], i]]
        doc = apply(copy.deepcopy(doc), ops)
        await pending.checkpoint(enc.encode(ops), base=ops[0][0] == "r")
    pending.close()
    return doc


async def test_sidecar_round_trip_and_bases(tmp_path):
    session_dir = tmp_path / "sessions" / "s1"
    session_dir.mkdir(parents=True)
    texts = [f"line {i}\n" for i in range(BASE_EVERY * 2 + 7)]
    final = await checkpoint_output(session_dir, "c1", texts)
    path = pending_path(session_dir, "c1")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    lines = path.read_bytes().split(b"\n")[:-1]
    assert len(lines) == len(texts)
    bases = [i for i, line in enumerate(lines) if b'"base":true' in line]
    assert bases == [0, BASE_EVERY, 2 * BASE_EVERY]
    assert lines[3].startswith(b'{"n":3,"base":false,"ops":')
    window = read_pending_window(session_dir, "c1")
    assert window == final
    assert window["content"][0]["text"] == "".join(texts)
    # A torn last line is ignored: the window is the one before it.
    with open(path, "ab") as f:
        f.write(b'{"n":999,"base":false,"ops":[["a",')
    assert read_pending_window(session_dir, "c1") == final
    assert read_pending_window(session_dir, "none") is None


async def test_sidecar_rules(tmp_path):
    session_dir = tmp_path / "s"
    session_dir.mkdir()
    pending = PendingOutput(session_dir, "c1")
    with pytest.raises(ValueError):
        await pending.checkpoint([["a", ["content", 0, "text"], "x"]], base=False)  # base first
    with pytest.raises(ValueError):
        await pending.checkpoint([["r", {}]], base=False)
    with pytest.raises(ValueError):
        PendingOutput(session_dir, "../evil")
    assert not pending_path(session_dir, "c1").exists()
    await pending.checkpoint([["r", {"content": []}]], base=True)
    assert pending.checkpoints == 1 and not pending.needs_base
    pending.retire()
    pending.retire()
    assert not pending_path(session_dir, "c1").exists()
    assert retire_settled(session_dir, ["c1", "__proto__"]) == 0


async def test_sidecar_failed_checkpoint_is_rolled_back(tmp_path, monkeypatch):
    session_dir = tmp_path / "s"
    session_dir.mkdir()
    pending = PendingOutput(session_dir, "c1")
    await pending.checkpoint([["r", {"content": [{"type": "text", "text": "a"}]}]], base=True)
    size = os.path.getsize(pending_path(session_dir, "c1"))
    real = os.fsync

    def failing_fsync(fd):  # fault injection
        raise OSError(5, "injected fsync failure")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageWriteError):
        await pending.checkpoint([["a", ["content", 0, "text"], "b"]], base=False)
    monkeypatch.setattr(os, "fsync", real)
    assert os.path.getsize(pending_path(session_dir, "c1")) == size
    assert pending.checkpoints == 1
    await pending.checkpoint([["a", ["content", 0, "text"], "c"]], base=False)
    pending.close()
    assert read_pending_window(session_dir, "c1")["content"][0]["text"] == "ac"


async def crashed_session(state_dir, compression="zstd") -> SessionLog:
    log = SessionLog.create(state_dir, "s1", make_header(), compression=compression)
    for type_, data in CRASHED:
        log.append(type_, data, time_ms=1_700_000_000_000)
    await log.aclose()  # then the daemon "crashes": no closers were written
    return log


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_open_for_write_repairs_flushes_and_is_idempotent(state_dir, compression):
    crashed = await crashed_session(state_dir, compression)
    session_dir = crashed.session_dir
    final = await checkpoint_output(session_dir, "c1", ["hello\n", "world\n"])
    (session_dir / "pending").joinpath("c3.ops.jsonl").write_bytes(b"")  # settled: retired on open

    log = await SessionLog.open_for_write(state_dir, "s1", repair=True)
    new = log.events[len(CRASHED):]
    assert [e.seq for e in new] == list(range(len(CRASHED), len(CRASHED) + len(EXPECTED)))
    assert log.durable_seq == log.last_seq == new[-1].seq  # flushed before returning
    assert len({e.time for e in new}) == 1
    expected = copy.deepcopy(EXPECTED)
    expected[1][1]["content"] = f"{OUTCOME_UNKNOWN_TEXT}\n\nlast output checkpointed before the interruption:\nhello\nworld\n"
    expected[1][1]["details"] = {"truncation": final["truncation"]}
    assert [(e.type, e.data) for e in new] == expected
    assert not pending_path(session_dir, "c1").exists()  # its result is durable now
    assert not pending_path(session_dir, "c3").exists()
    await log.aclose()

    on_disk = read_log(session_dir, "s1")
    assert on_disk.events == log.events
    size = os.path.getsize(log.path)
    again = await SessionLog.open_for_write(state_dir, "s1", repair=True)
    assert again.events == log.events  # nothing more to close
    await again.aclose()
    assert os.path.getsize(log.path) == size


async def test_repair_after_torn_tail_keeps_recovered_records(state_dir):
    log = await crashed_session(state_dir, compression="none")
    data = log.path.read_bytes()
    log.path.write_bytes(data[:-1])  # the last record lost only its newline: recovered
    repaired = await SessionLog.open_for_write(state_dir, "s1", repair=True)
    assert [(e.type, e.data) for e in repaired.events[: len(CRASHED)]] == CRASHED
    assert [e.type for e in repaired.events[len(CRASHED):]] == [t for t, _ in EXPECTED]
    await repaired.aclose()
    read = read_log(log.session_dir, "s1")
    assert not read.torn and len(read.events) == len(CRASHED) + len(EXPECTED)


async def test_failed_repair_flush_leaves_nothing_open(state_dir, monkeypatch):
    await crashed_session(state_dir)

    def failing_fsync(fd):  # fault injection
        raise OSError(5, "injected fsync failure")

    real = os.fsync
    monkeypatch.setattr(os, "fsync", failing_fsync)
    claims: set[str] = set()
    with pytest.raises(StorageWriteError):
        await SessionLog.open_for_write(state_dir, "s1", repair=True, claims=claims)
    monkeypatch.setattr(os, "fsync", real)
    assert claims == set()
    log = await SessionLog.open_for_write(state_dir, "s1", repair=True, claims=claims)
    assert log.last_seq == len(CRASHED) + len(EXPECTED) - 1
    await log.aclose()


def test_a_call_that_never_got_its_grant_did_not_start():
    """The gate precedes the barrier: a call asked about and never allowed cannot have run."""
    from dshd.storage.format import Event
    from dshd.storage.repair import NOT_GRANTED_TEXT, repair_closers

    def ev(seq, type_, data):
        return Event(seq=seq, time=0, type=type_, data=data)

    events = [
        ev(0, "tool/call", {"callId": "waiting", "name": "bash", "arguments": "{}"}),
        ev(1, "approval/asked", {"approvalId": "a1", "callId": "waiting", "tool": "bash", "summary": "x"}),
        ev(2, "tool/call", {"callId": "granted", "name": "bash", "arguments": "{}"}),
        ev(3, "approval/asked", {"approvalId": "a2", "callId": "granted", "tool": "bash", "summary": "y"}),
        ev(4, "approval/decided", {"approvalId": "a2", "outcome": "allowed-once", "by": "caller"}),
    ]
    closers = repair_closers(events)
    results = {d["callId"]: d for t, d in closers if t == "tool/result"}
    assert results["waiting"]["errorCode"] == "TOOL_NOT_STARTED"
    assert results["waiting"]["content"] == NOT_GRANTED_TEXT
    assert results["granted"]["errorCode"] == "TOOL_OUTCOME_UNKNOWN"
    assert ("approval/decided", {"approvalId": "a1", "outcome": "cancelled", "by": "repair"}) in closers
