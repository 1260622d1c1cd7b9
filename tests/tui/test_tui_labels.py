"""The running call's one-line command row is cut at its last cell with an ellipsis: it cut at
a word wrap with nothing to say so (``$ printf`` for ``printf '…'; …``), which hid what ran."""

from __future__ import annotations

import copy

from client.tui.app import DshApp
from client.tui.calls import CallView
from tests.tui import screens
from tests.tui.conftest import run_app, screen_text, until


def test_a_long_command_row_ends_in_an_ellipsis_at_the_cell_limit():
    app = DshApp(connect=False)
    lane = copy.deepcopy(screens.LANE)
    lane["tools"]["c-make"]["args"]["command"] = ("printf '" + "x" * 200 + "'; echo done")

    async def scenario(pilot):
        app.feed_sessions(screens.SESSIONS)
        app.feed.watched = "s-build"
        app.feed_lane("s-build", lane)
        await until(pilot, lambda: app.query(CallView), "the call box")
        await pilot.pause(0.2)
        row = next(line for line in screen_text(app).splitlines() if "$ printf" in line)
        assert "$ printf 'xxxx" in row and "…" in row, row

    run_app(app, scenario, size=(100, 30))


def test_a_title_does_not_read_as_a_name():
    """An unnamed session titled ``prod`` looked exactly like the session NAMED ``prod`` (list
    and "asks" row): a title shows in quotes (a name cannot hold one: protocol.names)."""
    from client.tui.panes import session_label
    assert session_label("prod", None, "s-1") == "prod"
    assert session_label(None, "prod", "s-2") == '"prod"'
    shown = session_label(None, "p\u202erod\x1b]0;x\x07", "s-3")
    assert shown.startswith('"p\\u202erod\\u001b') and "\x1b" not in shown, shown
