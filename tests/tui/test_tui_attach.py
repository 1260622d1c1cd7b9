"""Attach to a PTY call from the TUI (tuiterm's TerminalScreen) (a real dshd, a real PTY running ``cat``): keys reach the
command, Ctrl-P Ctrl-Q detaches and the call keeps running, the cancel key then ends it."""

from __future__ import annotations

from client.tui.app import DshApp
from client.tui.term import TerminalScreen
from tests.tui.conftest import run_app, until
from tests.tui.helpers import call_texts, confirm, start_pty_call


def test_attach_types_into_a_pty_call_and_detaches(daemon, workdir):
    assert daemon.dsh("run", "--name", "pty", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="pty")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        call_id = start_pty_call(daemon, app.feed.watched)
        await until(pilot, lambda: call_id in call_texts(app), "the PTY call listed")
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, TerminalScreen), "attached")
        await pilot.press(*"hello-pty", "enter")
        # The PTY echoes the line and cat prints it again: twice in the output.
        await until(pilot, lambda: "\n".join(app.screen.terminal.screen_model.display)
                    .count("hello-pty") >= 2, "typed keys reached the command")
        await pilot.press("ctrl+p", "ctrl+q")
        await until(pilot, lambda: not isinstance(app.screen, TerminalScreen), "detached")
        await pilot.pause(0.5)
        assert call_id in call_texts(app)  # detaching left the call running
        await pilot.press("c")
        await confirm(pilot, app)  # cancel, confirmed
        await until(pilot, lambda: call_id not in call_texts(app), "the call cancelled")
        recent = app.query_one("SessionPane").lane["recent"]
        assert recent[0]["callId"] == call_id

    run_app(app, scenario)
