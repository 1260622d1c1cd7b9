"""``dsh fsck``: through the fake server (the verdicts from session.list / session.get /
session.events), and ``--offline`` over hand-built logs in a temporary state directory: that
one runs ``python -m dshd fsck --offline`` (the daemon's package reads its own logs), so these
tests pin that the output and exit statuses of ``dsh fsck --offline`` did not change."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from client.cli.fsck import offline_command
from client.fsck import Verdict, repairs_in as _repairs_in
from protocol.events import decode_event
from dsh_proc import dsh
from client.api import connect
from fake_dshd import FakeDshd, FakeError
from tests.fsck_logs import OPEN, make_state_dir
from tests.fsck_logs import ev as _ev
from tests.fsck_logs import log_lines as _lines
from tests.fsck_logs import snapshot as _snapshot


@pytest.fixture
async def fake(nursery):
    d = tempfile.mkdtemp(prefix="dsh-f-", dir="/tmp")
    server = FakeDshd(os.path.join(d, "fake.sock"))
    await nursery.start(server.serve)
    yield server
    shutil.rmtree(d, ignore_errors=True)


def repairs_in(records: list[dict]) -> list[str]:
    """``client.fsck.repairs_in`` of records given as the wire's JSON (typed as the client
    types them, ``protocol.events``)."""
    return _repairs_in([decode_event(json.dumps(r)) for r in records])


def _row(sid: str, last_seq: int, **extra) -> dict:
    return {"sessionId": sid, "title": "t", "cwd": "/w", "createdAt": 0, "approvalPolicy": "ask",
            "sandbox": "workspace-write", "running": 0, "lastSeq": last_seq, **extra}


CRASHED = [
    _ev(0, "approval/policy", policy="ask", source="config"),
    _ev(1, "tool/call", callId="c1", name="bash", arguments='{"command":"make"}'),
    _ev(2, "tool/call", callId="c2", name="bash", arguments='{"command":"ls"}'),
    _ev(3, "approval/asked", approvalId="a-2", callId="c2", tool="bash", summary="ls"),
    # appended by the repair when the daemon opened it:
    _ev(4, "approval/decided", approvalId="a-2", outcome="cancelled", by="repair"),
    _ev(5, "tool/result", callId="c1", isError=True, content="it may or may not have run",
        details={}, errorCode="TOOL_OUTCOME_UNKNOWN"),
    _ev(6, "tool/result", callId="c2", isError=True, content="...", details={},
        errorCode="TOOL_OUTCOME_UNKNOWN"),
]


# ---------------------------------------------------------------------- pure
def test_repairs_in_names_the_closers_only():
    assert repairs_in(CRASHED[4:]) == ["approval a-2 cancelled", "call c1 TOOL_OUTCOME_UNKNOWN",
                                       "call c2 TOOL_OUTCOME_UNKNOWN"]
    live = [_ev(7, "tool/result", callId="c3", isError=False, content="", details={}),
            _ev(8, "approval/decided", approvalId="a-3", outcome="allowed-once", by="caller"),
            _ev(9, "step/end", turnId="t", stepId="s")]
    assert repairs_in(live) == []  # new events, but nothing a repair wrote
    closed = [_ev(10, "tool/result", callId="c4", isError=True, content="", details={},
                  errorCode="TOOL_NOT_STARTED"),
              _ev(11, "step/end", turnId="t", stepId="s2"),
              _ev(12, "turn/end", turnId="t", reason="interrupted")]
    assert repairs_in(closed) == ["call c4 TOOL_NOT_STARTED", "turn t interrupted",
                                  "step s2 closed"]


def test_verdict_text_and_json():
    assert Verdict("s", "ok").text() == "ok"
    assert Verdict("s", "damaged", "bad frame").text() == "damaged: bad frame"
    v = Verdict("s", "repaired", repairs=["call c TOOL_OUTCOME_UNKNOWN"])
    assert v.text() == "repaired: call c TOOL_OUTCOME_UNKNOWN"
    assert v.to_json() == {"sessionId": "s", "state": "repaired",
                           "repairs": ["call c TOOL_OUTCOME_UNKNOWN"]}
    assert not v.failed and Verdict("s", "unchecked", "locked").failed


def test_offline_runs_the_daemons_check_with_this_interpreter():
    import sys

    assert offline_command(None, None, False) == [sys.executable, "-m", "dshd", "fsck",
                                                  "--offline"]
    assert offline_command("/st", "-s1", True) == [sys.executable, "-m", "dshd", "fsck",
                                                   "--offline", "--state-dir", "/st", "--json",
                                                   "--", "-s1"]


def test_the_client_never_reads_the_logs_itself():
    import ast

    from conftest import ROOT

    for path in (ROOT / "client").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "dshd" or n.startswith("dshd.") for n in names), path


# ---------------------------------------------------------------------- online
def _script(fake: FakeDshd, rows: list[dict], events: dict[str, list[dict]],
            infos: dict[str, object]) -> None:
    """session.list answers ``rows``; session.get a SessionInfo from ``events`` or the error
    in ``infos``; session.events pages of ``events``."""

    async def listing(params):
        return {"sessions": rows}

    async def get(params):
        sid = params["sessionId"]
        answer = infos.get(sid)
        if isinstance(answer, FakeError):
            raise answer
        if sid not in events and not any(r["sessionId"] == sid for r in rows):
            raise FakeError(-32004, f"session {sid} not found; `dsh sessions` lists the sessions")
        log = events.get(sid, [])
        return {"sessionId": sid, "lastSeq": log[-1]["seq"] if log else -1}

    async def page(params):
        log = events.get(params["sessionId"], [])
        after, limit = params.get("afterSeq", -1), params.get("limit", 1000)
        return {"events": [e for e in log if e["seq"] > after][:limit],
                "lastSeq": log[-1]["seq"] if log else -1}

    fake.handlers.update({"session.list": listing, "session.get": get, "session.events": page})


async def test_fsck_reports_ok_repaired_and_damaged_and_exits_1(fake):
    rows = [
        _row("s1", 3),
        _row("s2", 3),
        {"sessionId": "s3", "damaged": "session s3: log /x is damaged at byte 118: frame does not "
                                       "decompress; it will not be opened for writing (run `dsh fsck`)"},
        _row("s4", 2),
        _row("s5", 0),
    ]
    _script(fake, rows, {"s1": CRASHED[:4], "s2": CRASHED}, {
        "s4": FakeError(-32014, "session s4 cannot be opened: log damaged at byte 40",
                        {"code": "LOG_DAMAGED"}),
        "s5": FakeError(-32005, "session s5 is locked by another process: process 7"),
    })
    proc = await dsh(fake.path, "fsck")
    assert proc.returncode == 1
    assert proc.stdout.decode() == (
        "s1\tok\n"
        "s2\trepaired: approval a-2 cancelled, call c1 TOOL_OUTCOME_UNKNOWN, "
        "call c2 TOOL_OUTCOME_UNKNOWN\n"
        "s3\tdamaged: session s3: log /x is damaged at byte 118: frame does not decompress; "
        "it will not be opened for writing\n"
        "s4\tdamaged: session s4 cannot be opened: log damaged at byte 40\n"
        "s5\tunchecked: session s5 is locked by another process: process 7\n")
    assert proc.stderr.decode() == ("fsck: 5 sessions: 1 ok, 1 repaired, 2 damaged, "
                                    "1 unchecked\n")
    # Each healthy session was opened (that is what repairs it), the damaged one was not.
    assert [p["sessionId"] for m, p in fake.requests if m == "session.get"] == ["s1", "s2", "s4", "s5"]
    assert ("session.events", {"sessionId": "s2", "afterSeq": 3, "limit": 1000}) in fake.requests


async def test_fsck_one_session_and_json_exit_0(fake):
    _script(fake, [_row("s1", 3), _row("s2", 3)], {"s2": CRASHED}, {})
    proc = await dsh(fake.path, "fsck", "--json", "s2")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [{"sessionId": "s2", "state": "repaired", "repairs": [
        "approval a-2 cancelled", "call c1 TOOL_OUTCOME_UNKNOWN", "call c2 TOOL_OUTCOME_UNKNOWN"]}]
    assert [p["sessionId"] for m, p in fake.requests if m == "session.get"] == ["s2"]


async def test_fsck_of_an_unknown_session_is_the_daemons_error(real_dshd):
    proc = await dsh(real_dshd.socket, "fsck", "missing")
    assert proc.returncode == 1
    [line] = proc.stderr.decode().splitlines()
    assert line.startswith("dsh: session missing ") and "not found" in line


async def test_fsck_of_healthy_sessions_is_0(real_dshd, tmp_path):
    async with connect(real_dshd.socket) as c:
        sid = await c.create_session(tmp_path)
        await c.wait(sid, await c.run_tool(sid, "true"))
    proc = await dsh(real_dshd.socket, "fsck", sid)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{sid}\tok\n".encode(),
                                                          b"fsck: 1 session: 1 ok\n")


async def test_fsck_without_daemon_is_2(tmp_path):
    proc = await dsh(str(tmp_path / "none.sock"), "fsck")
    assert proc.returncode == 2 and "dshd is not running" in proc.stderr.decode()


# ---------------------------------------------------------------------- offline
@pytest.fixture
def state(tmp_path) -> Path:
    root = make_state_dir(tmp_path / "state")
    assert OPEN == CRASHED[:4]  # the open session is this file's crash, before the repair
    return root


async def test_fsck_offline_reads_every_log_and_never_writes(state, tmp_path):
    before = _snapshot(state)
    second_frame = bytearray((state / "sessions/cbad/session.v1.jsonl.zst").read_bytes()).index(
        b"\x28\xb5\x2f\xfd", 4)
    gap_line = len(_lines("egap", [CRASHED[0]])[0]) + len(_lines("egap", [CRASHED[0]])[1])
    proc = await dsh(str(tmp_path / "no.sock"), "fsck", "--offline", "--state-dir", str(state))
    assert proc.returncode == 1
    out = proc.stdout.decode().splitlines()
    assert out[0] == "aok\tok"
    assert out[1].startswith("btorn\ttorn tail at byte ") and "1 record recovered" in out[1]
    assert out[2].startswith(f"cbad\tdamaged: {state}/sessions/cbad/session.v1.jsonl.zst is "
                             f"damaged at byte {second_frame}: frame does not decompress")
    assert out[3] == ("dopen\tneeds repair on open: approval a-2 cancelled, "
                      "call c1 TOOL_OUTCOME_UNKNOWN, call c2 TOOL_NOT_STARTED")  # c2 never granted
    assert out[4] == (f"egap\tdamaged: {state}/sessions/egap/session.v1.jsonl is damaged at byte "
                      f"{gap_line}: seq gap: expected 1, found 2")
    assert out[5] == "fnolog\tdamaged: no log file (created but never written)"
    assert proc.stderr.decode() == ("fsck: 6 sessions: 1 ok, 1 torn, 3 damaged, "
                                    "1 needs-repair\n")
    assert _snapshot(state) == before


async def test_fsck_offline_one_session_json_and_errors(state, tmp_path):
    sock = str(tmp_path / "no.sock")
    proc = await dsh(sock, "fsck", "--offline", "--state-dir", str(state), "--json", "btorn")
    assert proc.returncode == 0
    [verdict] = json.loads(proc.stdout)
    assert verdict["state"] == "torn" and verdict["recovered"] == 1 and verdict["offset"] > 0
    proc = await dsh(sock, "fsck", "--offline", "--state-dir", str(state), "dopen")
    assert proc.returncode == 0  # needs repair is not damage: the daemon repairs it on open
    proc = await dsh(sock, "fsck", "--offline", "--state-dir", str(state), "zzz")
    assert proc.returncode == 1
    assert proc.stderr.decode() == f"dsh: no session zzz: {state}/sessions/zzz\n"
    proc = await dsh(sock, "fsck", "--offline", "--state-dir", str(tmp_path / "nowhere"))
    assert proc.returncode == 1 and "no such state directory" in proc.stderr.decode()
    proc = await dsh(sock, "fsck", "--state-dir", str(state))
    assert proc.returncode == 2 and "--offline" in proc.stderr.decode()


async def test_fsck_offline_warns_when_a_daemon_holds_the_state_dir(state, tmp_path):
    fd = os.open(state / "dshd.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = await dsh(str(tmp_path / "no.sock"), "fsck", "--offline", "--state-dir",
                         str(state), "aok")
    finally:
        os.close(fd)
    assert proc.returncode == 0
    assert proc.stderr.decode().startswith(f"dsh: a running dshd holds {state}:")
