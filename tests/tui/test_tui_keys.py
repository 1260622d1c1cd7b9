"""Keys typed fast (no pause between them, as a terminal delivers a pasted or quickly typed
line): the keys after a focus key land where that key moved the focus; and the help screen
at 80×24 shows every binding's whole description (wrapped, scrolled), none cut."""

from __future__ import annotations

import re

from textual import events
from textual.keys import _character_to_key
from textual.widgets import Input

from client.tui.app import AttachKeys, DshApp
from client.tui.help import HelpScreen, key_rows
from client.tui.panes import SessionsPane
from tests.tui import screens
from tests.tui.conftest import run_app, screen_text


def _post_keys(app: DshApp, keys: list[str]) -> None:
    """Each key as the driver posts it (named as Pilot names it), all at once: no wait for
    idle between them, unlike ``pilot.press``."""
    for key in keys:
        char = key if len(key) == 1 else None
        if len(key) == 1 and not key.isalnum():
            key = _character_to_key(key)
        app.post_message(events.Key(key, char))


async def _settle(pilot) -> None:
    for _ in range(5):
        await pilot.pause()


def test_letters_typed_right_after_colon_land_in_the_command_line():
    app = DshApp(connect=False)

    async def scenario(pilot):
        await screens.feed(app)
        await _settle(pilot)
        assert isinstance(app.focused, SessionsPane)
        # ``c`` cancels, ``t`` attaches, ``a`` allows for the session in the sessions pane.
        _post_keys(app, [":", *"cat notes"])
        await _settle(pilot)
        command = app.query_one("#command", Input)
        assert app.focused is command
        assert command.value == "cat notes"
        assert not list(app._notifications), "a letter ran a sessions-pane binding"

    run_app(app, scenario)


def test_a_colon_typed_in_the_command_line_stays_in_it():
    app = DshApp(connect=False)

    async def scenario(pilot):
        await _settle(pilot)
        _post_keys(app, [":", *"echo a:b/c", "i"])
        await _settle(pilot)
        assert app.query_one("#command", Input).value == "echo a:b/ci"

    run_app(app, scenario)


def test_keys_right_after_escape_go_to_the_sessions_pane():
    app = DshApp(connect=False)

    async def scenario(pilot):
        await screens.feed(app)
        await _settle(pilot)
        _post_keys(app, [":", *"ls", "escape", "down"])
        await _settle(pilot)
        command = app.query_one("#command", Input)
        assert command.value == "ls"
        pane = app.query_one(SessionsPane)
        assert app.focused is pane
        assert pane.cursor_row == 1, "down after escape did not move the sessions cursor"

    run_app(app, scenario)


def _words(text: str) -> list[str]:
    return text.split()


def test_the_help_at_80x24_shows_every_description_whole():
    app = DshApp(connect=False)
    rows = key_rows([DshApp, AttachKeys, HelpScreen])

    async def scenario(pilot):
        await pilot.press("f1")
        await _settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        seen: list[str] = []
        for _ in range(40):  # page through the help, collecting what is on screen
            seen.extend(screen_text(app).splitlines())
            scroller = app.screen.query_one("#keys")
            before = scroller.scroll_y
            await pilot.press("pagedown")
            await _settle(pilot)
            if scroller.scroll_y == before:
                break
        text = " ".join(" ".join(re.sub(r"[│╭╮╰╯─▁▔▎▊]", " ", line).split())
                        for line in seen)
        for where, keys, what in rows:
            assert " ".join(_words(what)) in text, (what, "\n".join(seen))
            assert keys in text, (keys, "\n".join(seen))

    run_app(app, scenario, size=(80, 24))


def test_a_feed_callback_after_the_screen_is_gone_does_nothing():
    """The feed's worker (and DataTable's cursor messages) can call the app a message after its
    widgets are gone; in CI that raised NoMatches out of the app ('SessionsPane' on
    Screen(_default)). Now such a late call does nothing."""
    app = DshApp(connect=False)

    async def scenario(pilot):
        await pilot.pause()
        for widget in list(app.screen.children):
            await widget.remove()
        app.feed_sessions([])
        app.feed_lane("s-1", {"session": {"sessionId": "s-1"}})
        app.feed_lost("gone", 1.0)
        app.feed_connected()
        assert app.watched_id() is None

    run_app(app, scenario)
