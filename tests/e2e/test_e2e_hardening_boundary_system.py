"""System mode: ``dsh run`` as an unprivileged session owner whose call's output outgrew the
live window (issue 10 item 23). The spill file is root's (0600 under 0700 directories), so
the owner's ``dsh run`` must not rely on reading it: it prints what it has, says honestly
where the complete output is, and exits with the command's status. Real users, real setpriv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .test_e2e_system_mode import system_daemon  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parents[2]


def test_dsh_run_as_the_owner_does_not_rely_on_reading_the_spill_file(system_daemon):  # noqa: F811
    d, member, stranger, mine, secret = system_daemon
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(mine),
           "DSH_SOCKET": str(d.socket), "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    r = subprocess.run(
        ["setpriv", f"--reuid={member.pw_uid}", f"--regid={member.pw_gid}", "--init-groups",
         sys.executable, "-m", "client.cli", "run", "--", "seq", "1", "100000"],
        cwd=mine, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stdout.splitlines()
    assert lines and lines[-1] == "100000"  # the window it has ends with the last line
    assert len(r.stdout) < 588_895  # not all of it: the spill file is root's
    notes = [line for line in r.stderr.splitlines() if "root" in line]
    assert len(notes) == 1, r.stderr  # one clear line: where the rest is, and how to read it
    assert "spill" in notes[0] or "/spill/" in notes[0]
    assert "Permission denied" not in r.stderr
