"""`dsh help` (issue 15 item 6): the group's help, a command's, and the exit-status table,
through the real CLI. README.md's table is compared with the generated one in
tests/test_docs.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from client import exits
from tests.ops.helpers import DSH


def _dsh(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([*DSH, *args], capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)


def test_help_exit_codes_lists_every_status_of_client_exits_with_its_meaning():
    r = _dsh("help", "exit-codes")
    assert r.returncode == 0, r.stderr
    labels = re.findall(r"^  (\d+(?:, \d+)*|N)  ", r.stdout, re.M)
    shown = {int(n) for label in labels if label != "N" for n in label.split(", ")}
    constants = {v for k, v in vars(exits).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert constants <= shown, f"not in dsh help exit-codes: {sorted(constants - shown)}"
    assert {129, 143} <= shown and "N" in labels
    assert "TOOL_TIMEOUT" in r.stdout and "`" not in r.stdout  # code spans printed as text
    assert "A call that is an error never exits 0." in r.stdout


def test_help_alone_is_the_group_help_and_help_command_is_that_commands_help():
    alone, group = _dsh("help"), _dsh("--help")
    assert alone.returncode == 0 and alone.stdout == group.stdout
    for name in ("exit-codes",):
        assert name in alone.stdout  # the help command's line names its topic
    for command in ("run", "wait", "completion"):
        via_help, direct = _dsh("help", command), _dsh(command, "--help")
        assert via_help.returncode == 0, via_help.stderr
        assert via_help.stdout == direct.stdout and f"Usage: dsh {command}" in direct.stdout


def test_help_unknown_name_is_a_usage_error_naming_what_there_is():
    r = _dsh("help", "nosuch")
    assert r.returncode == exits.EXIT_DAEMON_NOT_RUNNING == 2  # click's usage error status
    assert "no command or help topic 'nosuch'" in r.stderr
    assert "run" in r.stderr and "exit-codes" in r.stderr and r.stdout == ""


def test_markdown_and_json_go_with_the_exit_codes_topic_only():
    for flag in ("--markdown", "--json"):
        r = _dsh("help", "run", flag)
        assert r.returncode == 2 and "go with the exit-codes topic only" in r.stderr, flag
    both = _dsh("help", "exit-codes", "--json", "--markdown")
    assert both.returncode == 2 and "not both" in both.stderr
    for args in (("help", "exit-codes", "--json"), ("--json", "help", "exit-codes")):
        r = _dsh(*args)
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)
        (timeout,) = [row for row in rows if row["statuses"] == [124]]
        assert timeout["meaning"].startswith("TOOL_TIMEOUT (dsh run --timeout)")
        assert rows[1]["statuses"] is None and all("`" not in x["meaning"] for x in rows)
        assert len(rows) == len(exits.EXIT_TABLE)
    md = _dsh("help", "exit-codes", "--markdown")
    assert md.returncode == 0 and md.stdout.startswith("| status | meaning |\n|---|---|\n")
    assert "| `124` | `TOOL_TIMEOUT`" in md.stdout


def test_help_needs_no_daemon():
    env = dict(os.environ, DSH_SOCKET="/nonexistent/dshd.sock")
    r = subprocess.run([sys.executable, "-m", "client.cli", "help", "exit-codes"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "124" in r.stdout
