"""``dsh tui`` in a real terminal: tmux at 80x24 and at 200x60, driven with send-keys; and the
full-screen attach to a PTY call (``TerminalScreen``) typed into and detached from in tmux.

Each size: the app starts on a daemon with a session named ``alpha`` and shows it in the
sessions pane; ``:`` and a command typed in one send-keys land in the command line, the
command runs and its output shows live in the
session pane; F1 opens the help screen with every key readable (the key and what it does
on one line); Escape closes it; the layout fills the pane's width; Ctrl-Q quits and the shell
prompt comes back. The screens are read with ``capture-pane`` (``tests.e2e.tmux.Pane``), and
each is checked to fit the size (no line wider than the pane, no more lines than rows).
"""

from __future__ import annotations

import re
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

                # ``:`` and the command in ONE send-keys (one read for the app): every key
                # after the ``:`` lands in the command line, none in the sessions pane (where
                # ``c`` would cancel); the command runs and its output shows live.
                command = "for i in $(seq 1 400); do echo out-line-$i; sleep 0.1; done"
                pane.type(":" + command, literal=True)
                pane.until(r"^▊  for i in \$\(seq 1 400\); do echo")
                pane.type("Enter")
                pane.until(r"out-line-\d*[3-9]")
                fits(pane, cols, rows)

                # The help screen: every key and what it does, on one line each.
                pane.type("F1")  # the help key that works in the command line too
                pane.until(r"keys")
                lines = fits(pane, cols, rows)
                wanted = ((r"ctrl\+q", "quit"), (r"f1, \?", "help"),
                          (r"ctrl[-+]p ctrl[-+]q", "detach"))
                for _ in range(6):  # taller than the screen at 80x24: Page Down scrolls it
                    if all(any(re.search(k, line) and w in line for line in lines)
                           for k, w in wanted):
                        break
                    pane.type("NPage")
                    time.sleep(0.3)
                    lines += fits(pane, cols, rows)
                text = "\n".join(lines)
                for key, what in wanted:
                    assert any(re.search(key, line) and what in line for line in lines), text
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


#: Starts a pre-approved PTY call in the session named argv[1] and prints its callId.
PTY_CALL = r"""
import sys, trio
from client.api import connect
async def main(name, command):
    async with connect(None) as c:
        sid, _ = await c.find_session(name)
        print((await c.start_tool(sid, command, tty=(80, 24))).call_id, flush=True)
trio.run(main, sys.argv[1], sys.argv[2])
"""


#: Prints ``running`` when the call in session argv[1] has not ended (tool.wait times out).
STILL_RUNNING = r"""
import sys, trio
from client.api import connect
from protocol.rpc import RpcError
async def main(name, call):
    async with connect(None) as c:
        sid, _ = await c.find_session(name)
        try:
            await c.wait(sid, call, timeout=0.5)
            print("ended")
        except RpcError as exc:
            print("running" if exc.code == -32010 else exc)
trio.run(main, sys.argv[1], sys.argv[2])
"""


def test_attach_in_a_real_terminal_types_and_detaches():
    """Under tmux (80x24): ctrl+o attaches the session's PTY call full screen
    (``TerminalScreen``); keys typed in tmux reach it and its answer shows; Ctrl-P Ctrl-Q
    comes back to the main screen and the call goes on running."""
    import subprocess
    import sys

    root = Path(tempfile.mkdtemp(prefix="dsh-tmux-attach-", dir="/tmp"))
    work = root / "work"
    work.mkdir()
    try:
        with running_daemon() as daemon:
            assert daemon.dsh("run", "--name", "alpha", "--", "true",
                              cwd=str(work)).returncode == 0
            command = ("printf 'pty-ready\\n'; while read -r l; do echo \"got:$l\"; done")
            started = subprocess.run([sys.executable, "-c", PTY_CALL, "alpha", command],
                                     env=daemon.env, capture_output=True, text=True,
                                     timeout=60)
            assert started.returncode == 0, started.stderr
            pane = Pane(root, str(daemon.socket), work, cols=80, rows=24)
            try:
                pane.line("dsh tui alpha")
                pane.until(r"f1 help")
                pane.until(r"pty-ready")  # its box on the main screen
                pane.type("C-o")
                pane.until(r"detaches")  # the attach screen's notice
                pane.type("hello tmux", literal=True)
                pane.type("Enter")
                pane.until(r"^got:hello tmux")  # at column 0: the PTY's own screen
                pane.type("C-p")
                pane.type("C-q")
                pane.until(r"sessions")  # back on the main screen
                assert pane.until(r"f1 help")
                pane.type("C-q")
                pane.until(r"^[$#] ?$")
            finally:
                pane.close()
            still = subprocess.run([sys.executable, "-c", STILL_RUNNING, "alpha",
                                    started.stdout.strip()], env=daemon.env,
                                   capture_output=True, text=True, timeout=60)
            assert still.stdout.strip() == "running", (still.stdout, still.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
