"""A multi-line paste on the command line (a new user's bracketed paste of `echo one` and
`echo two`) ran `echo one` and dropped the rest without a word: Textual's Input keeps a
paste's first line. Now the lines show joined by a mark and run as one bash command."""

from __future__ import annotations

from textual import events

from client.tui.app import DshApp
from client.tui.commandline import NEWLINE_MARK
from tests.tui.conftest import run_app, until


def test_a_pasted_multi_line_text_runs_as_one_command(daemon, workdir):
    assert daemon.dsh("run", "--name", "paste", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="paste")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        await pilot.press("colon")
        command = app.query_one("#command")
        command.post_message(events.Paste("echo one > out.txt\r\necho two >> out.txt\n"))
        await until(pilot, lambda: command.value, "the paste in the line")
        assert command.value == f"echo one > out.txt{NEWLINE_MARK}echo two >> out.txt"
        await pilot.press("enter")
        box = app.query_one("#last-result")
        await until(pilot, lambda: box.has_class("shown"), "the result shown")
        assert "exit 0" in str(box.render())

    run_app(app, scenario)
    assert (workdir / "out.txt").read_text() == "one\ntwo\n"  # both lines ran, once
