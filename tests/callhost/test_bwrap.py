"""The real host around a real bwrap sandbox: a terminal inside it, and TERM reaching the
command's trap on terminate (bwrap's own two processes are spared)."""

from __future__ import annotations

import shutil

import pytest

from tests.callhost import helpers

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")

SCRIPT = """
trap 'echo got-TERM; exit 7' TERM
tty
stty size
test -t 0 && echo interactive
echo ready
while :; do sleep 0.1; done
"""


def _bwrap(script: str) -> list[str]:
    return [shutil.which("bwrap"), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--unshare-pid", "--unshare-net", "--die-with-parent", "--", "/bin/sh", "-c", script]


def test_a_tty_under_bwrap_and_term_reaches_the_trap(hosts):
    run = hosts(_bwrap(SCRIPT), tty={"cols": 100, "rows": 30, "term": "xterm"},
                spare_wrapper="bwrap")
    out = run.wait_output(b"ready").decode()
    lines = out.replace("\r", "").splitlines()
    assert lines[0].startswith("/dev/"), lines
    assert lines[1:4] == ["30 100", "interactive", "ready"], lines
    conn = run.connect()
    conn.request("attach")
    assert conn.request("terminate", grace=10, reason="cancelled")["ok"] is True
    record = conn.next_event("exit")["record"]
    assert b"got-TERM" in run.output(), run.output()
    assert record["exitCode"] == 7 and record["reason"] == "cancelled", record
    assert helpers.token_carriers(run.spec["token"]) == []


def test_terminate_under_bwrap_kills_what_ignores_term(hosts):
    script = "trap '' TERM; sleep 300 & echo ready; wait"
    run = hosts(_bwrap(script), spare_wrapper="bwrap")
    run.wait_output(b"ready")
    conn = run.connect()
    conn.request("attach")
    conn.request("terminate", grace=0.5, reason="killed")
    record = conn.next_event("exit")["record"]
    assert record["reason"] == "killed" and record["exitCode"] is not None, record
    assert helpers.token_carriers(run.spec["token"]) == []
