"""``dsh tui`` in tmux: the session pane's rows go to what has something to show (a new
user's findings, read with capture-pane). At 80x24 the recent list shrank to an empty
``recent:`` heading next to blank rows, the newest of two running calls' boxes was cut to
its top border, and the header wrapped onto two lines; at 200x60 a box kept 12 output lines
with 14-30 blank rows below."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.e2e.conftest import running_daemon
from tests.e2e.tmux import Pane, have_tmux
from tests.tui.test_tmux_tui import fits

pytestmark = pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")

LOOP = "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); echo {word}-$i; sleep 0.05; done"


def session_rows(lines: list[str]) -> list[str]:
    """The session pane's content rows (right of the sessions pane, inside its border)."""
    top = lines[0]
    start = top.index("╮╭") + 2
    return [line[start:].rstrip()[1:-1] if len(line) > start else ""
            for line in lines[1:] if "╰" not in line[start:start + 1]][:-1]


def start_loop(daemon, name: str, word: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "client.cli", "run", "--session", name,
                             "--", "sh", "-c", LOOP.format(word=word)], env=daemon.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("cols,rows", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_the_session_pane_leaves_no_rows_blank_while_it_hides_something(cols, rows):
    root = Path(tempfile.mkdtemp(prefix="dsh-tmux-rows-", dir="/tmp"))
    work = root / "work"
    work.mkdir()
    loops: list[subprocess.Popen] = []
    try:
        with running_daemon() as daemon:
            assert daemon.dsh("run", "--name", "rows", "--", "true", cwd=str(work)).returncode == 0
            for n in range(12):  # recent results: more than fit at 80x24
                assert daemon.dsh("run", "--session", "rows", "--", "echo", f"old-{n}",
                                  cwd=str(work)).returncode == 0
            pane = Pane(root, str(daemon.socket), work, cols=cols, rows=rows)
            try:
                pane.line("dsh tui rows")
                pane.until(r"f1 help")
                pane.until(r"╭─+ rows ─")
                loops.append(start_loop(daemon, "rows", "older"))
                pane.until(r"older-\d+")
                loops.append(start_loop(daemon, "rows", "newer"))
                pane.until(r"newer-[2-9]\d")  # the newest call shows output, a while in
                pane.until(r"older-[2-9]\d\d|newer-[2-9]\d\d")  # boxes full of output
                lines = fits(pane, cols, rows)
                screen = "\n".join(lines)
                content = session_rows(lines)
                assert "sandbox" in content[0] or "…" in content[0], screen  # one row
                assert "sandbox" not in content[1] and "policy" not in content[1], screen
                for i, row in enumerate(content):  # a box shows output, or is counted
                    if re.search(r"╭─ ?c-\w+ · ", row):
                        assert "$ " in content[i + 1], screen
                        assert re.search(r"(newer|older)-\d+", content[i + 2]), screen
                assert re.search(r"newer-\d+", screen), screen  # the newest call's box
                if not re.search(r"older-\d+", screen):
                    assert "+1 more running" in screen, screen
                for i, row in enumerate(content):  # never a heading alone
                    if row.strip().startswith("recent:"):
                        assert "exit 0" in content[i + 1], screen
                blank = [row for row in content if not row.strip()]
                assert len(blank) <= 2, screen  # only a box's margin
                if rows >= 60:
                    shown = [row for row in content if re.search(r"(newer|older)-\d+", row)]
                    assert len(shown) > 24, screen  # more than 12 lines a box
            finally:
                pane.close()
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        shutil.rmtree(root, ignore_errors=True)
