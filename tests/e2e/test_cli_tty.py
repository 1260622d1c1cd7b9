"""``dsh run -t`` and ``dsh attach`` of a tty call in a real terminal (tmux), against a real
dshd: the PTY's device and size, resizes, full-screen programs (vim, less, top), Ctrl-C to
the command, the detach keys and re-attaching, the local terminal restored afterwards."""

from __future__ import annotations

import os
import re
import shutil
import signal

import pytest

from tests.e2e.conftest import live_processes_matching, running_daemon
from tests.e2e.tmux import Pane, have_tmux

pytestmark = pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")


@pytest.fixture(scope="module")
def dshd():
    with running_daemon(prefix="dsh-tty-") as d:
        yield d


@pytest.fixture
def pane(dshd, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    p = Pane(tmp_path, str(dshd.socket), work)
    p.work = work
    try:
        yield p
    finally:
        p.close()


def ids(pane: Pane) -> tuple[str, str]:
    found = pane.until(r"session (\S+) call (\S+)")
    return found.group(1), found.group(2)


def editor() -> str:
    for name in ("vim.tiny", "vi", "vim"):
        if shutil.which(name):
            return name
    pytest.skip("no vi (Debian's vim-tiny) is installed")


def test_a_tty_call_has_a_terminal_of_the_panes_size(pane):
    cols, rows = pane.size()
    mark = pane.run("dsh run -t -- sh -c 'tty; stty size; test -t 0 && echo interactive'")
    assert pane.done(mark) == 0
    screen = pane.screen()
    assert re.search(r"^/dev/\S+\s*$", screen, re.M), screen
    assert f"{rows} {cols}" in screen
    assert re.search(r"^interactive\s*$", screen, re.M)


def test_resizing_the_window_resizes_the_commands_terminal(pane):
    mark = pane.run("dsh run -t -- sh -c 'while read line; do echo \"size: $(stty size)\"; "
                    "done'")
    pane.until(r"session \S+ call \S+")
    pane.line("a")
    pane.until(r"size: 40 120")
    pane.resize(100, 30)
    cols, rows = pane.size()
    assert (cols, rows) == (100, 30)
    pane.line("b")
    pane.until(r"size: 30 100")
    pane.type("C-d")  # end of input under the PTY: read ends, the loop too
    assert pane.done(mark) == 0


def test_vi_edits_a_file_and_writes_it(pane):
    target = pane.work / "note.txt"
    target.write_text("first line\n")
    mark = pane.run(f"dsh run -t -- {editor()} note.txt")
    pane.until(r"first line")
    pane.type("G", "o")  # open a line below the last
    pane.type("written in vi", literal=True)
    pane.type("Escape")
    pane.type(":wq", literal=True)
    pane.type("Enter")
    assert pane.done(mark) == 0
    assert target.read_text() == "first line\nwritten in vi\n"


def test_less_renders_a_page_and_quits(pane):
    (pane.work / "lines.txt").write_text("".join(f"line number {i}\n" for i in range(1, 501)))
    mark = pane.run("dsh run -t -- less lines.txt")
    pane.until(r"^line number 1\s*$")
    pane.until(r"^line number 39\s*$")
    assert "line number 41\n" not in pane.screen()  # one page of a 40-row terminal
    pane.type("q")
    assert pane.done(mark) == 0


def test_top_renders_once(pane):
    if not shutil.which("top"):
        pytest.skip("procps (top) is not installed")
    mark = pane.run("dsh run -t -- top -n1")
    assert pane.done(mark) == 0
    screen = pane.screen()
    assert "load average" in screen and re.search(r"Tasks:\s+\d+ total", screen), screen
    assert "failed tty get" not in screen


@pytest.mark.parametrize("sandbox", [
    "danger-full-access",
    "",  # bwrap: its processes are in the terminal's foreground group too (HOST.md §5)
])
def test_ctrl_c_under_a_pty_interrupts_the_command(pane, sandbox):
    flag = f"--sandbox {sandbox} " if sandbox else ""
    mark = pane.run(f"dsh run -t {flag}-- sh -c 'trap \"echo trapped INT; exit 7\" INT; "
                    "echo ready; while :; do sleep 0.1; done'")
    pane.until(r"^ready")
    pane.type("C-c")  # a byte to the PTY: its line discipline sends SIGINT to the command
    assert pane.done(mark) == 7
    screen = pane.screen()
    assert "trapped INT" in screen and "detached" not in screen


def test_detach_keys_leave_it_running_and_attach_comes_back(pane):
    mark = pane.run("dsh run -t -- sh -c 'echo ready; read line; echo \"got $line\"; exit 4'")
    session_id, call_id = ids(pane)
    pane.until(r"^ready")
    pane.type("C-p")
    pane.type("C-q")
    pane.until(r"detached \(Ctrl-P Ctrl-Q\); the command keeps running\. Re-attach: "
               rf"dsh attach {session_id} --call {call_id}")
    assert pane.done(mark) == 0
    mark = pane.run(f"dsh attach {session_id} --call {call_id}")
    pane.until(rf"── call {call_id}")
    pane.line("again")
    pane.until(r"^got again")
    assert pane.done(mark) == 4


def test_custom_detach_keys_and_a_lone_prefix_goes_through(pane):
    mark = pane.run("dsh run -t --detach-keys ctrl-a,d -- sh -c 'while read line; do "
                    "echo \"line: $line\"; done'")
    pane.until(r"session \S+ call \S+")
    pane.type("C-a")
    pane.type("x", "Enter")  # not the sequence: Ctrl-A x reaches the command as typed
    pane.until(r"^line: \S*x")
    pane.type("C-a")
    pane.type("d")
    pane.until(r"detached \(Ctrl-A d\)")
    assert pane.done(mark) == 0


def test_the_local_terminal_is_restored_after_every_way_out(pane):
    before = pane.run("stty -g > before.txt")
    assert pane.done(before) == 0
    mark = pane.run("dsh run -t -- sh -c 'exit 3'")
    assert pane.done(mark) == 3
    mark = pane.run("dsh run -t -- sh -c 'echo ready; sleep 30'")
    pane.until(r"^ready")
    pane.type("C-p")
    pane.type("C-q")
    assert pane.done(mark) == 0
    mark = pane.run("dsh run -t -- sh -c 'echo ready; sleep 31'")
    pane.until(r"^ready")
    [pid] = live_processes_matching("client.cli run -t -- sh -c echo ready; sleep 31")
    os.kill(pid, signal.SIGTERM)  # detaches: the terminal's mode is restored on the way out
    assert pane.done(mark) == 143
    mark = pane.run("stty -g > after.txt")
    assert pane.done(mark) == 0
    assert (pane.work / "after.txt").read_text() == (pane.work / "before.txt").read_text()


#: The pane's modes a full-screen program may leave on, as tmux reports them (all off: "0").
MODES = ("#{alternate_on} #{keypad_flag} #{keypad_cursor_flag} #{mouse_any_flag} "
         "#{mouse_standard_flag} #{mouse_button_flag} #{mouse_all_flag} #{mouse_sgr_flag}")


def test_detaching_from_vi_gives_the_terminal_back(pane):
    """A new user's report: detached from vim, the terminal stayed in vim's alternate screen,
    the detach line printed over vim's text and its `~` lines stayed."""
    (pane.work / "note.txt").write_text("first line\n")
    before = pane.display(MODES)
    mark = pane.run(f"dsh run -t -- {editor()} note.txt")
    session_id, call_id = ids(pane)
    pane.until(r"first line")
    pane.until(r"^~")
    assert pane.display("#{alternate_on}") == "1", "vi did not take the alternate screen"
    pane.type("C-p")
    pane.type("C-q")
    assert pane.done(mark) == 0
    assert pane.display(MODES) == before, "the terminal was not given back"
    assert pane.display("#{cursor_flag}") == "1"
    screen = pane.screen()
    assert re.search(r"^detached \(Ctrl-P Ctrl-Q\); the command keeps running", screen,
                     re.M), screen
    assert not re.search(r"^~\s*$", screen, re.M), screen
    assert "first line" not in screen, screen
    assert pane.done(pane.run(f"dsh cancel {session_id} {call_id}")) == 0


def test_a_command_that_ends_in_its_modes_gives_the_terminal_back(pane):
    """A program killed before its own clean-up: its modes are undone at its end too, and
    dsh's line starts a line of its own."""
    before = pane.display(MODES)
    mark = pane.run("dsh run -t -- sh -c 'printf \"\\033[?1049h\\033[?25l\\033[?1002h"
                    "\\033[?1006h\\033[?1h\\033=\\033[1;31m%s-%s\" full screen; sleep 1; exit 5'")
    pane.until(r"full-screen")
    assert pane.done(mark) == 5
    assert pane.display(MODES) == before, "the terminal was not given back"
    assert pane.display("#{cursor_flag}") == "1"
    screen = pane.screen()
    assert "full-screen" not in screen, screen
    assert re.search(r"^DONE\d+-5", screen, re.M), screen
