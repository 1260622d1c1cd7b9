"""The session name in the settings fold and a session's activity in its summary (issue 15):
a snapshot written before names existed still reads (its name is None); ``summary.json`` v2
carries ``updatedAt`` / ``lastExit``, kept up to date by the frames after it, rebuilt the same
from the last snapshot (a v1 summary is not used)."""

from __future__ import annotations

import json
import os

from storage_helpers import make_header

from dshd.storage import SessionLog
from dshd.storage.format import new_event
from dshd.storage.reader import read_log
from dshd.storage.repair import RepairState
from dshd.storage.snapshot import (EMPTY_SETTINGS, activity_of, base_activity, fold_settings,
                                   snapshot_problem, snapshot_settings)
from dshd.storage.summary import SUMMARY_NAME, read_summary

DEFAULTS = {"approvalPolicy": "ask", "sandbox": "workspace-write", "owner": None}


class Owner:
    def state(self) -> dict:
        return {"recent": []}


def _ev(seq: int, type_: str, data: dict, t: int = 1000):
    return new_event(seq, type_, data, ignorable=type_.startswith("session/"), time_ms=t)[0]


def test_the_name_folds_and_an_old_snapshot_without_it_still_reads():
    settings = fold_settings(dict(EMPTY_SETTINGS), _ev(0, "session/name", {"name": "build"}))
    assert settings["name"] == "build"
    assert fold_settings(settings, _ev(1, "session/name", {"name": None}))["name"] is None
    old = {"through": 4, "verifiedThrough": 10, "prev": None, "repair": RepairState().to_json(),
           "settings": {"approvalPolicy": "ask", "sandbox": None, "owner": None},
           "session": {}}
    assert snapshot_problem(old, 5) is None
    assert snapshot_settings(old) == {**old["settings"], "name": None}
    assert snapshot_problem({**old, "settings": {"approvalPolicy": "ask"}}, 5) == \
        "has bad settings"


def test_activity_is_the_newest_event_and_the_newest_result():
    base = base_activity({"recent": [{"callId": "a", "exitCode": 7, "errorCode": None}]})
    assert base == {"updatedAt": None, "lastExit": 7}
    events = [_ev(5, "tool/result", {"callId": "b", "exitCode": 0}, 2000),
              _ev(6, "tool/result", {"callId": "c", "exitCode": None,
                                     "errorCode": "TOOL_TIMEOUT"}, 3000),
              _ev(7, "turn/start", {"turnId": "t"}, 4000)]
    assert activity_of(base, events) == {"updatedAt": 4000, "lastExit": "TOOL_TIMEOUT"}
    assert activity_of(base, events[:1]) == {"updatedAt": 2000, "lastExit": 0}
    assert activity_of(base, []) == base


async def test_the_summary_carries_name_and_activity_through_every_path(state_dir):
    log = SessionLog.create(state_dir, "s1", make_header(), snapshot_every=4,
                            snapshot_state=Owner().state)
    log.append("session/name", {"name": "build"}, ignorable=True)
    for i in range(6):
        log.append("tool/call", {"callId": f"c{i}", "name": "bash", "arguments": "{}"})
        log.append("tool/result", {"callId": f"c{i}", "isError": i == 5, "content": "",
                                   "details": {}, "exitCode": i})
        await log.flush()
    await log.aclose()
    newest = max(e.time for e in read_log(log.session_dir, "s1").events
                 if e.type != "log/snapshot")
    summary = read_summary(log.session_dir, "s1", DEFAULTS)
    assert summary.settings["name"] == "build"
    assert summary.activity == {"updatedAt": newest, "lastExit": 5}
    stored = json.loads((log.session_dir / SUMMARY_NAME).read_text())
    assert stored["v"] == 2 and stored["activity"]["lastExit"] == 5
    stale = (log.session_dir / SUMMARY_NAME).read_bytes()
    more = await SessionLog.open_for_write(state_dir, "s1")
    more.append("tool/call", {"callId": "late", "name": "bash", "arguments": "{}"})
    ev = more.append("tool/result", {"callId": "late", "isError": True, "content": "",
                                     "details": {}, "errorCode": "TOOL_CANCELLED"})
    more.append("session/name", {"name": "renamed"}, ignorable=True)
    await more.aclose()
    (log.session_dir / SUMMARY_NAME).write_bytes(stale)  # the frames after it are folded
    fresh = read_summary(log.session_dir, "s1", DEFAULTS)
    assert fresh.settings["name"] == "renamed"
    assert fresh.activity["lastExit"] == "TOOL_CANCELLED"
    assert fresh.activity["updatedAt"] >= ev.time
    v1 = {**json.loads(stale), "v": 1}
    del v1["activity"]
    (log.session_dir / SUMMARY_NAME).write_text(json.dumps(v1))  # older format: not used
    assert read_summary(log.session_dir, "s1", DEFAULTS) == fresh
    os.unlink(log.session_dir / SUMMARY_NAME)  # from the last snapshot
    assert read_summary(log.session_dir, "s1", DEFAULTS) == fresh
