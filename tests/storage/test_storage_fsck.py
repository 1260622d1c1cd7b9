"""``python -m dshd fsck --offline``: the verdicts over hand-built logs in a temporary state
directory, run as a real subprocess; its output and exit statuses are those of
``dsh fsck --offline`` (compared byte for byte)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fsck_logs import CLEAN, OPEN, make_state_dir
from tests.fsck_logs import log_lines as _lines
from tests.fsck_logs import plain_log as _plain_log
from tests.fsck_logs import snapshot as _snapshot
from dshd.storage.fsck import Verdict, check_offline, closer_label, daemon_holds, offline_ids

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dshd", *args], capture_output=True,
                          cwd=str(ROOT), env=env or _env(), timeout=60, check=False)


def _env(**extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("DSH_STATE_DIR", None)
    env.pop("COLUMNS", None)
    return {**env, **extra}


@pytest.fixture
def state(tmp_path) -> Path:
    return make_state_dir(tmp_path / "state")


def test_every_log_is_judged_and_nothing_is_written(state):
    before = _snapshot(state)
    second = bytearray((state / "sessions/cbad/session.v1.jsonl.zst").read_bytes()).index(
        b"\x28\xb5\x2f\xfd", 4)
    gap_line = sum(len(line) for line in _lines("egap", [OPEN[0]]))
    proc = _run("fsck", "--offline", "--state-dir", str(state))
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout.decode().splitlines()
    assert out[0] == "aok\tok"
    assert out[1].startswith("btorn\ttorn tail at byte ") and "1 record recovered" in out[1]
    assert out[2].startswith(f"cbad\tdamaged: {state}/sessions/cbad/session.v1.jsonl.zst is "
                             f"damaged at byte {second}: frame does not decompress")
    assert out[3] == ("dopen\tneeds repair on open: approval a-2 cancelled, "
                      "call c1 TOOL_OUTCOME_UNKNOWN, call c2 TOOL_NOT_STARTED")  # never granted
    assert out[4] == (f"egap\tdamaged: {state}/sessions/egap/session.v1.jsonl is damaged at byte "
                      f"{gap_line}: seq gap: expected 1, found 2")
    assert out[5] == "fnolog\tdamaged: no log file (created but never written)"
    assert len(out) == 6
    assert proc.stderr.decode() == "fsck: 6 sessions: 1 ok, 1 torn, 3 damaged, 1 needs-repair\n"
    assert _snapshot(state) == before


def test_one_session_json_and_the_exit_statuses(state, tmp_path):
    proc = _run("fsck", "--offline", "--state-dir", str(state), "--json", "btorn")
    assert proc.returncode == 0, proc.stderr
    [verdict] = json.loads(proc.stdout)
    assert verdict["state"] == "torn" and verdict["recovered"] == 1 and verdict["offset"] > 0
    assert proc.stderr.decode() == "fsck: 1 session: 1 torn\n"
    proc = _run("fsck", "--offline", "--state-dir", str(state), "dopen")
    assert proc.returncode == 0  # needs repair is not damage: the daemon repairs it on open
    proc = _run("fsck", "--offline", "--state-dir", str(state), "cbad")
    assert proc.returncode == 1
    proc = _run("fsck", "--offline", "--state-dir", str(state), "zzz")
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr.decode() == f"dsh: no session zzz: {state}/sessions/zzz\n"
    proc = _run("fsck", "--offline", "--state-dir", str(state), "bad/id")
    assert proc.returncode == 1 and proc.stderr.decode() == "dsh: invalid session id: 'bad/id'\n"
    proc = _run("fsck", "--offline", "--state-dir", str(tmp_path / "nowhere"))
    assert proc.returncode == 1 and "no such state directory" in proc.stderr.decode()
    proc = _run("fsck", "--state-dir", str(state))  # the daemon has no online fsck
    assert proc.returncode == 2 and "--offline" in proc.stderr.decode()


def test_the_state_dir_defaults_to_dsh_state_dir(state):
    proc = _run("fsck", "--offline", "aok", env=_env(DSH_STATE_DIR=str(state)))
    assert (proc.returncode, proc.stdout) == (0, b"aok\tok\n"), proc.stderr


def test_an_empty_state_dir_is_0(tmp_path):
    proc = _run("fsck", "--offline", "--state-dir", str(tmp_path))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"fsck: 0 sessions\n")


def test_a_running_daemon_is_named(state):
    fd = os.open(state / "dshd.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert daemon_holds(state)
        proc = _run("fsck", "--offline", "--state-dir", str(state), "aok")
    finally:
        os.close(fd)
    assert proc.returncode == 0
    assert proc.stderr.decode().startswith(f"dsh: a running dshd holds {state}:")
    assert not daemon_holds(state)


def test_a_closed_stdout_is_141(state):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "dshd", "fsck", "--offline", "--state-dir",
                               str(state)], stdout=write_end, stderr=subprocess.PIPE,
                              cwd=str(ROOT), env=_env(), timeout=60, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr


def test_the_output_is_that_of_dsh_fsck_offline(state, tmp_path):
    """Byte for byte the same as the client's ``dsh fsck --offline`` (which runs this one)."""
    for args in ([], ["--json"], ["dopen"], ["zzz"]):
        mine = _run("fsck", "--offline", "--state-dir", str(state), *args)
        env = _env(DSH_SOCKET=str(tmp_path / "no.sock"))
        theirs = subprocess.run([sys.executable, "-m", "client.cli", "fsck", "--offline",
                                 "--state-dir", str(state), *args], capture_output=True,
                                cwd=str(ROOT), env=env, timeout=60, check=False)
        assert (mine.returncode, mine.stdout, mine.stderr) == (
            theirs.returncode, theirs.stdout, theirs.stderr), args


# ---------------------------------------------------------------------- the verdicts, in-process
def test_check_offline_of_a_clean_plain_log(tmp_path):
    _plain_log(tmp_path, "p1", b"".join(_lines("p1", CLEAN[0] + CLEAN[1])))
    assert check_offline(tmp_path, "p1") == Verdict("p1", "ok", pending=True)


def test_an_unreadable_log_is_unchecked(tmp_path):
    (tmp_path / "sessions" / "p2" / "session.v1.jsonl").mkdir(parents=True)  # read: EISDIR
    verdict = check_offline(tmp_path, "p2")
    assert verdict.state == "unchecked" and verdict.failed
    assert verdict.text() == "unchecked: cannot read the log: Is a directory"


def test_offline_ids_and_labels(state):
    assert offline_ids(state, None) == ["aok", "btorn", "cbad", "dopen", "egap", "fnolog"]
    assert offline_ids(state, "aok") == ["aok"]
    with pytest.raises(ValueError):
        offline_ids(state, "..")
    assert closer_label("turn/end", {"turnId": "t1", "reason": "interrupted"}) == \
        "turn t1 interrupted"
    assert closer_label("turn/end", {"turnId": "t1", "reason": "done"}) is None
    assert Verdict("s", "torn", offset=9, recovered=2, repairs=["x"], pending=True).to_json() == {
        "sessionId": "s", "state": "torn", "needsRepair": ["x"], "offset": 9, "recovered": 2}


def test_both_fsck_checks_label_closers_with_the_one_protocol_function():
    """The offline check (here) and the client's online one name closers with
    ``protocol.events.closer_label``: one function, and its repair codes are the repair's."""
    from client import fsck as online
    from dshd.storage import repair
    from protocol import events

    assert closer_label is events.closer_label and online.closer_label is events.closer_label
    assert set(events.REPAIR_CODES) == {repair.TOOL_OUTCOME_UNKNOWN, repair.TOOL_NOT_STARTED}
    assert events.closer_label("tool/result", {"callId": "c", "errorCode": "TOOL_NOT_STARTED"}) \
        == "call c TOOL_NOT_STARTED"
