"""An unnamed session is listed by its title, as on the web page (name, else title, else id),
not by its id; the id shows in the session pane's header. Before, the sessions pane listed
``mx5pt1fxscz0``-like ids a person cannot tell apart."""

from __future__ import annotations

from client.tui.app import DshApp
from client.tui.panes import SessionsPane
from tests.tui.conftest import run_app, screen_text, until
from tests.tui.helpers import listed_names


def test_unnamed_sessions_show_their_title_and_the_id_in_the_header(daemon, workdir):
    r = daemon.dsh("run", "--", "echo", "titled-by-command", cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    r = daemon.dsh("run", "--name", "named", "--", "true", cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    app = DshApp(socket=daemon.socket)

    async def scenario(pilot):
        await until(pilot, lambda: len(listed_names(app)) == 2, "both sessions listed")
        assert sorted(listed_names(app)) == ['"echo titled-by-command"', "named"]
        table = app.query_one(SessionsPane)
        table.select(next(str(k.value) for k in table.rows
                          if table.get_row(k)[0] == '"echo titled-by-command"'))
        unnamed = table.selected_id()
        await until(pilot, lambda: unnamed in screen_text(app), "the id in the header")
        assert app.query_one("SessionPane").border_title == '"echo titled-by-command"'

    run_app(app, scenario, size=(80, 24))


def test_a_session_the_tui_makes_is_titled_by_its_first_command(daemon, workdir):
    app = DshApp(socket=daemon.socket)

    async def scenario(pilot):
        await until(pilot, lambda: app.feed.client is not None, "connected")
        await pilot.press("colon", *"echo first-input", "enter")
        await until(pilot, lambda: listed_names(app) == ['"echo first-input"'],
                    "the new session listed by its first command")

    run_app(app, scenario, size=(80, 24))
