"""The TUI's screens without a daemon: snapshots of the main screen and the help (fed from
fixed values, so they are deterministic: no times, ids or live data), the help lists every
binding, a resize reflows, the approval keys with nothing asked do nothing."""

from __future__ import annotations

from textual.binding import Binding

from client.tui.app import DshApp
from client.tui.attach import AttachScreen
from client.tui.help import HelpScreen, key_rows
from client.tui.panes import ApprovalsBar, SessionPane, SessionsPane
from tests.tui.conftest import run_app
from tests.tui import screens


def offline_app() -> DshApp:
    return DshApp(connect=False)


def test_snapshot_main_screen(snap_compare):
    """Sessions, a running call with coloured output, the approvals bar, recent, the turn."""
    assert snap_compare(offline_app(), terminal_size=(120, 40),
                        run_before=lambda pilot: screens.feed(pilot.app))


def test_snapshot_help_screen(snap_compare):
    async def before(pilot):
        await screens.feed(pilot.app)
        await pilot.press("question_mark")

    assert snap_compare(offline_app(), terminal_size=(120, 40), run_before=before)


def test_snapshot_small_terminal(snap_compare):
    """80×24 reflows: both panes and the bar still fit."""
    assert snap_compare(offline_app(), terminal_size=(80, 24),
                        run_before=lambda pilot: screens.feed(pilot.app))


def test_the_help_lists_every_binding():
    owners = [DshApp, AttachScreen, HelpScreen]
    rows = key_rows(owners)
    shown = {(where, keys) for where, keys, _ in rows}
    for owner in owners:
        for binding in owner.BINDINGS:
            assert isinstance(binding, Binding)
            assert any(owner.HELP_NAME == where and binding.description in what
                       for where, _, what in rows), binding
        for keys, _ in getattr(owner, "EXTRA_KEYS", ()):
            assert (owner.HELP_NAME, keys) in shown
    app = offline_app()

    async def scenario(pilot):
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.text()
        for binding in DshApp.BINDINGS:
            assert binding.description in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)

    run_app(app, scenario)


def test_a_resize_reflows_the_panes():
    app = offline_app()

    async def scenario(pilot):
        await screens.feed(app)
        await pilot.pause()
        wide = app.query_one(SessionPane).size.width
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.query_one(SessionPane).size.width < wide
        assert app.query_one(ApprovalsBar).region.bottom <= 24
        await pilot.resize_terminal(200, 60)
        await pilot.pause()
        assert app.query_one(SessionPane).size.width > wide
        assert app.query_one(SessionsPane).row_count == 3

    run_app(app, scenario)


def test_the_approval_keys_with_nothing_asked_decide_nothing():
    app = offline_app()

    async def scenario(pilot):
        await pilot.press("y")
        await pilot.pause()
        assert not app.query_one(ApprovalsBar).has_class("asking")
        assert any("nothing waits" in n.message for n in app._notifications)

    run_app(app, scenario)
