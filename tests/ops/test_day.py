"""`make day`'s script in its quick mode (`--minutes 1`): a smoke run against a real daemon
through the real CLI. Every room of issue 15 is merged, so it runs without `--allow-missing`:
a step whose command this build lacks fails the day; every step must pass, and the state must
stay under its bound."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_day_passes_and_prints_the_state_before_and_after_prune():
    r = subprocess.run([sys.executable, str(REPO / "tools/day.py"), "--minutes", "1",
                        "--pause", "5"], capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    out = r.stdout
    assert "FAILED" not in out
    assert re.search(r"^== du -sh state dir before dsh prune: \S+", out, re.M)
    assert re.search(r"^== du -sh state dir after dsh prune: +\S+", out, re.M)
    assert re.search(r"^state bound \d+ bytes; peak seen \d+ once retention had its chance "
                     r"\(at most 15 s\): within; highest instant sample \d+$", out, re.M)
    runs = re.search(r"^  runs +ok +(\d+) +failed +0", out, re.M)
    assert runs and int(runs.group(1)) >= 1
    assert re.search(r"^  detach/attach +ok +[1-9]\d* +failed +0", out, re.M)
    assert re.search(r"^  chat re-join +ok +[1-9]\d* +failed +0$", out, re.M)
    assert "SKIPPED" not in out and "skipped:" not in out


def test_the_day_refuses_bad_arguments():
    r = subprocess.run([sys.executable, str(REPO / "tools/day.py"), "--minutes", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--minutes: 0 < N <= 1440" in r.stderr
