"""The TUI's screens without a daemon: snapshots of the main screen and the help (fed from
fixed values, so they are deterministic: no times, ids or live data), the help lists every
binding, a resize reflows, the approval keys with nothing asked do nothing."""

from __future__ import annotations

from textual.binding import Binding

from client.tui.app import AttachKeys, DshApp
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
    owners = [DshApp, AttachKeys, HelpScreen]
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


def test_a_hundred_calls_with_full_windows_render_only_their_tails():
    """100 running calls, each with a full 2,000-line window (the daemon's default bound):
    each box renders its last TAIL_LINES lines, never the window."""
    from client.tui.calls import TAIL_LINES, CallView

    window = "".join(f"line {i}\n" for i in range(2000))
    lane = dict(screens.LANE, approvals={}, turn=None, tools={
        f"c{n:03}": {"name": "bash", "args": {"command": f"job {n}"}, "state": "running",
                     "startedAt": n, "output": {"content": [{"type": "text", "text": window}]}}
        for n in range(100)})
    app = offline_app()

    async def scenario(pilot):
        app.feed_sessions(screens.SESSIONS)
        app.feed.watched = "s-build"
        app.feed_lane("s-build", lane)
        await pilot.pause()
        views = list(app.query(CallView))
        assert len(views) == 100
        for view in views:
            shown = view.shown_output.split("\n")
            assert len(shown) == TAIL_LINES and shown[-1] == "line 1999"
        # The same value again changes nothing; one call's new output re-renders that one.
        lane["tools"]["c050"]["output"]["content"][0]["text"] = window + "line new\n"
        app.feed_lane("s-build", lane)
        await pilot.pause()
        assert app.query_one("#call-c050", CallView).shown_output.endswith("line new")

    run_app(app, scenario)


def test_the_mouse_picks_a_session_and_presses_a_decision():
    """A click on a row watches that session; a click on a button decides (here: with no
    daemon the decision is refused at once, with a message)."""
    app = offline_app()

    async def scenario(pilot):
        await screens.feed(app)
        await pilot.pause()
        table = app.query_one(SessionsPane)
        assert table.selected_id() == "s-build"
        assert await pilot.click(SessionsPane, offset=(5, 3))  # the second row: docs
        await pilot.pause()
        assert table.selected_id() == "s-docs"
        assert app.feed.watched == "s-docs"
        app.feed.watched = "s-build"
        app.feed_lane("s-build", screens.LANE)
        await pilot.pause()
        assert await pilot.click("#approve-once")
        await pilot.pause()
        assert any("dshd is not reachable" in n.message for n in app._notifications)

    run_app(app, scenario)


def test_a_long_cwd_is_cut_from_the_left_and_home_is_a_tilde(monkeypatch):
    from client.tui.panes import CWD_CELLS, short_path

    monkeypatch.setenv("HOME", "/home/dev")
    assert short_path("/home/dev/project") == "~/project"
    assert short_path("/home/devil") == "/home/devil"
    long = "/srv/" + "x" * 100 + "/end"
    assert len(short_path(long)) == CWD_CELLS and short_path(long).endswith("x/end")
    assert short_path(long).startswith("…")
