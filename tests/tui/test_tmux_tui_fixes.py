"""``dsh tui`` in tmux at 80x24: what a real terminal showed wrong, each read with capture-pane.

- ``dsh tui build`` watches ``build`` (created first, two newer sessions) and keeps watching it
  across polls, while sessions are added to the list (the session pane's title is the watched
  session's name).
- A running call's live output and a typed command's result both show at 80x24.
- Every action of the approvals bar reads as a whole word at 80 columns, and so does the
  footer's.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from tests.e2e.conftest import running_daemon
from tests.e2e.tmux import Pane, have_tmux
from client.api import connect
from tests.tui.helpers import ask_from_outside
from tests.tui.test_tmux_tui import fits, visible

pytestmark = pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")

COLS, ROWS = 80, 24


@pytest.fixture
def world():
    root = Path(tempfile.mkdtemp(prefix="dsh-tmux-fix-", dir="/tmp"))
    work = root / "work"
    work.mkdir()
    try:
        with running_daemon() as daemon:
            pane = Pane(root, str(daemon.socket), work, cols=COLS, rows=ROWS)
            try:
                yield daemon, pane, work
            finally:
                pane.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def session_id(daemon, name: str) -> str:
    async def find() -> str:
        async with connect(daemon.socket) as client:
            return (await client.find_session(name))[0]
    return trio.run(find)


def session_title(pane: Pane) -> str:
    """The session pane's border title (the watched session), off the top row."""
    top = next(line for line in visible(pane, ROWS) if "sessions" in line)
    found = re.search(r"╮╭─+ ?(.*?) ?─*╮\s*$", top)
    assert found, top
    return found.group(1)


def test_the_session_named_at_start_stays_watched_across_polls(world):
    daemon, pane, work = world
    made = daemon.dsh("run", "--name", "build", "--", "true", cwd=str(work))
    assert made.returncode == 0, made.stderr
    for _ in range(2):  # two newer sessions, unnamed
        made = daemon.dsh("run", "--", "true", cwd=str(work))
        assert made.returncode == 0, made.stderr
    pane.line("dsh tui build")
    pane.until(r"f1 help")
    pane.until(r"╭─+ build ─")  # the session pane watches build
    # A poll later (the list changed: a new session's row), build is still the one watched.
    made = daemon.dsh("run", "--name", "later", "--", "true", cwd=str(work))
    assert made.returncode == 0, made.stderr
    pane.until(r"│ later ")
    made = daemon.dsh("run", "--session", "later", "--", "false", cwd=str(work))
    pane.until(r"│ later .* 1 ")  # later's last exit shows: another poll
    assert session_title(pane) == "build", pane.screen()


def test_every_approvals_bar_action_reads_whole_at_80_columns(world):
    daemon, pane, work = world
    made = daemon.dsh("run", "--name", "asks", "--", "true", cwd=str(work))
    assert made.returncode == 0, made.stderr
    pane.line("dsh tui asks")
    pane.until(r"╭─+ asks ─")  # watched: the TUI answers the session's requests
    asking = ask_from_outside(daemon, session_id(daemon, "asks"), "echo asked-from-outside")
    try:
        pane.until(r"asks: echo asked-from-outside")
        pane.until(r"allow once")  # the buttons, drawn
        lines = fits(pane, COLS, ROWS)
        screen = "\n".join(lines)
        buttons = next(line for line in lines if "allow once" in line)
        for action in ("y allow once", "a for session", "n reject", "v view all"):
            assert action in buttons, screen  # each key and its whole word
        footer = lines[-1]
        for action in ("f1 help", "^q quit", "^t chat", "^o attach", "^k cancel"):
            assert action in footer, screen
    finally:
        asking.kill()
        asking.wait()


def test_a_running_calls_output_shows_beside_a_typed_result_at_80x24(world):
    daemon, pane, work = world
    made = daemon.dsh("run", "--name", "busy", "--", "true", cwd=str(work))
    assert made.returncode == 0, made.stderr
    for word in range(6):  # recent results to fill their list
        done = daemon.dsh("run", "--session", "busy", "--", "echo", f"old-{word}",
                          cwd=str(work))
        assert done.returncode == 0, done.stderr
    pane.line("dsh tui busy")
    pane.until(r"f1 help")
    pane.until(r"╭─+ busy ─")
    pane.type(":for i in $(seq 1 1000); do echo line$i; sleep 0.1; done", literal=True)
    pane.type("Enter")
    pane.until(r"│ *line\d+ ")  # its output in its box
    pane.type("echo typed-result", literal=True)  # the command line kept the focus
    pane.type("Enter")
    pane.until(r"\$ echo typed-result → exit 0")
    pane.until(r"│ *line[2-9]\d ")  # a later poll: still shown, and going on
    lines = fits(pane, COLS, ROWS)
    output = [line for line in lines if re.search(r"│ *line\d+ ", line)]
    assert len(output) >= 3, "\n".join(lines)  # a few lines of the running call's output
    assert any("typed-result" in line for line in lines), "\n".join(lines)
