"""``dsh tui`` in a real terminal: tmux at 80x24 and at 200x60, driven with send-keys.

Each size: the app starts on a daemon with a session named ``alpha`` and shows it in the
sessions pane; a command typed on the command line runs and its output shows live in the
session pane; F1 opens the help screen with every key readable (the key and what it does
on one line); Escape closes it; the layout fills the pane's width; Ctrl-Q quits and the shell
prompt comes back. The screens are read with ``capture-pane`` (``tests.e2e.tmux.Pane``), and
each is checked to fit the size (no line wider than the pane, no more lines than rows).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import running_daemon
from tests.e2e.tmux import LIVENESS_S, Pane, have_tmux

pytestmark = pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")

SIZES = [(80, 24), (200, 60)]


def visible(pane: Pane, rows: int) -> list[str]:
    """The rows on screen now (capture-pane of the visible pane only)."""
    return pane._tmux("capture-pane", "-p", "-t", "t").splitlines()[:rows]


def fits(pane: Pane, cols: int, rows: int) -> list[str]:
    lines = visible(pane, rows)
    assert len(lines) <= rows, lines
    assert all(len(line) <= cols for line in lines), [len(line) for line in lines]
    return lines


def gone(pane: Pane, rows: int, text: str) -> None:
    deadline = time.monotonic() + LIVENESS_S
    while any(text in line for line in visible(pane, rows)):
        assert time.monotonic() < deadline, f"{text!r} still on screen:\n{pane.screen()}"
        time.sleep(0.1)


def focus_command_line(pane: Pane, rows: int) -> None:
    """``:`` focuses the command line; keys typed before the focus moved would go to the
    sessions pane (where letters are bindings), so probe with ``#`` (no binding) until the
    command line shows it, then erase the probes."""
    pane.type(":")
    deadline = time.monotonic() + LIVENESS_S
    while True:
        pane.type("#", literal=True)
        time.sleep(0.2)
        line = next((ln for ln in visible(pane, rows) if ln.startswith("▊  #")), None)
        if line is not None:
            break
        assert time.monotonic() < deadline, "the command line never took a key"
    for _ in range(line.count("#")):
        pane.type("BSpace")
    pane.until(r"^▊  bash command")  # empty again: its placeholder is back


@pytest.mark.parametrize("cols,rows", SIZES, ids=[f"{c}x{r}" for c, r in SIZES])
def test_dsh_tui_screens_are_readable(cols, rows):
    root = Path(tempfile.mkdtemp(prefix="dsh-tmux-tui-", dir="/tmp"))
    work = root / "work"
    work.mkdir()
    try:
        with running_daemon() as daemon:
            made = daemon.dsh("run", "--name", "alpha", "--", "true", cwd=str(work))
            assert made.returncode == 0, made.stderr
            pane = Pane(root, str(daemon.socket), work, cols=cols, rows=rows)
            try:
                assert pane.size() == (cols, rows)
                pane.line("dsh tui alpha")
                pane.until(r"sessions")
                pane.until(r"^│ alpha ")  # the named session's row in the sessions pane
                pane.until(r"f1 help")  # the footer
                lines = fits(pane, cols, rows)
                top = next(line for line in lines if "sessions" in line)
                assert top.startswith("╭") and top.rstrip().endswith("╮") \
                    and len(top.rstrip()) == cols, top  # the panes fill the width

                # A command typed on the command line runs; its output shows live.
                focus_command_line(pane, rows)
                pane.type("for i in $(seq 1 400); do echo out-line-$i; sleep 0.1; done",
                          literal=True)
                pane.type("Enter")
                pane.until(r"out-line-\d*[3-9]")
                fits(pane, cols, rows)

                # The help screen: every key and what it does, on one line each.
                pane.type("F1")  # the help key that works in the command line too
                pane.until(r"keys")
                lines = fits(pane, cols, rows)
                text = "\n".join(lines)
                for key, what in (("ctrl+q", "quit"), ("f1, ?", "help"),
                                  ("ctrl+p ctrl+q", "detach")):
                    assert any(key in line and what in line for line in lines), text
                pane.type("Escape")
                gone(pane, rows, "dsh tui: keys")  # the help closed
                pane.type("C-q")  # quit (the call goes on in dshd; its close ends it)
                pane.until(r"^[$#] ?$")  # the shell's prompt is back: the terminal restored
                assert not any("Error" in line or "Warning" in line
                               for line in visible(pane, rows)), pane.screen()
            finally:
                pane.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
