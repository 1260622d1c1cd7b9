"""Recent results show the command and a readable status at 80 columns (issue 17, tuifix2
item 5): they showed ``c-780b19d3d153 bash exit 0`` and, at 80 columns, the error codes cut to
``TOOL``/``APPR``. The lane's ``recent`` carries no arguments: the TUI keeps the command of a
call it saw running, and reads the others' from the log (``tool/call``)."""

from __future__ import annotations

from client.tui.app import DshApp
from client.tui.panes import status_word
from tests.tui.conftest import run_app, screen_text, until


def test_status_words_are_short_and_plain():
    assert status_word({"exitCode": 0}) == "exit 0"
    assert status_word({"errorCode": "APPROVAL_REJECTED", "isError": True}) == "rejected"
    assert status_word({"errorCode": "TOOL_CANCELLED", "isError": True}) == "cancelled"
    assert status_word({"errorCode": "TOOL_TIMEOUT", "isError": True}) == "timed out"
    assert status_word({"errorCode": "SOMETHING_NEW", "isError": True}) == "something new"


def test_recent_results_show_their_commands_at_80_columns(daemon, workdir):
    # Calls made before the TUI starts: it never saw them run, the log has their commands.
    for word in ("alpha-cmd", "beta-cmd"):
        r = daemon.dsh("run", "--name", "rec", "--", "echo", word, cwd=str(workdir))
        assert r.returncode == 0, r.stderr
    app = DshApp(socket=daemon.socket, session="rec")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        await until(pilot, lambda: "echo alpha-cmd" in screen_text(app)
                    and "echo beta-cmd" in screen_text(app), "the commands of old calls")
        # A call seen running: its command is remembered from the lane's tools entry.
        await pilot.press("colon", *"sleep 1; echo gamma-cmd", "enter")
        await until(pilot, lambda: "gamma-cmd" in str(app.query_one("#recent").render()),
                    "the command of a call seen running")
        assert "exit 0" in str(app.query_one("#recent").render())

    run_app(app, scenario, size=(80, 24))
