"""The daemon's log set-up: loggers are cached, and a reload (a second ``configure``) still
reaches a logger that was already used (its level and its format)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import sys
from dshd import logging as dlog
log = dlog.get_logger("dshd.test")
dlog.configure("json", "info")
log.info("first", n=1)
log.info("again", n=2)
dlog.configure("json", "warning")
log.info("hidden", n=3)
log.warning("shown", n=4)
dlog.configure("console", "info")
log.info("console-line", n=5)
dlog.configure("json", "debug")
log.debug("debug-line", n=6, obj=object.__new__(type("Odd", (), {"__str__": lambda s: "odd!"})))
"""


def test_a_reload_reaches_a_logger_already_used():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=30, check=True).stderr.splitlines()
    assert [json.loads(out[0])["event"], json.loads(out[1])["event"]] == ["first", "again"]
    assert json.loads(out[0])["level"] == "info" and json.loads(out[0])["n"] == 1
    assert json.loads(out[2])["event"] == "shown"  # "hidden" was below the new level
    assert "console-line" in out[3] and not out[3].lstrip().startswith("{")
    last = json.loads(out[4])
    assert last["event"] == "debug-line" and last["obj"] == "odd!" and len(out) == 5
