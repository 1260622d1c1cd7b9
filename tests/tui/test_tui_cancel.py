"""``c`` cancels the selected call, after a confirmation (issue 17, tuifix2 item 6): it
cancelled the newest call at once, with no way to choose. Now a call box is selected by
focus (tab, click), ``c`` asks "cancel …? y/n" and only ``y`` cancels; any other key keeps
the call running."""

from __future__ import annotations

import subprocess
import sys

from client.tui.app import DshApp
from client.tui.calls import CallView
from tests.tui.conftest import run_app, screen_text, until
from tests.tui.helpers import call_texts, confirm

START = r"""
import sys, trio
from client.api import connect
async def main(session, command):
    async with connect(None) as c:
        print((await c.start_tool(session, command, approved=True)).call_id, flush=True)
trio.run(main, sys.argv[1], sys.argv[2])
"""


def start_call(daemon, session: str, command: str) -> str:
    r = subprocess.run([sys.executable, "-c", START, session, command], env=daemon.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_c_asks_then_cancels_the_selected_call(daemon, workdir):
    assert daemon.dsh("run", "--name", "can", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="can")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        older = start_call(daemon, app.feed.watched, "sleep 120; echo older")
        newer = start_call(daemon, app.feed.watched, "sleep 120; echo newer")
        await until(pilot, lambda: {older, newer} <= set(call_texts(app)), "both listed")
        await pilot.press("c")  # nothing selected: it asks about the newest
        await pilot.pause(0.3)
        await pilot.press("escape")  # not y: nothing is cancelled
        await pilot.pause(1.0)
        assert {older, newer} <= set(call_texts(app))
        box = app.query_one(f"#call-{older}", CallView)
        await pilot.click(f"#call-{older}")
        await until(pilot, lambda: app.query_one("SessionPane").selected_call() == older,
                    "the older call selected")
        assert box.has_focus or box.has_focus_within
        await pilot.press("c")
        await pilot.pause(0.3)
        assert {older, newer} <= set(call_texts(app)), "cancelled before the confirmation"
        await confirm(pilot, app)
        await until(pilot, lambda: older not in call_texts(app), "the selected call cancelled")
        await pilot.pause(0.5)
        assert newer in call_texts(app), "the other call was cancelled too"
        await pilot.press("escape", "c")  # from the sessions list: the newest
        await confirm(pilot, app)
        await until(pilot, lambda: newer not in call_texts(app), "the newest cancelled")

    run_app(app, scenario)


def test_ctrl_k_cancels_from_the_command_line(daemon, workdir):
    """ctrl+k in the command line did nothing (Textual's Input binds it: delete to the end);
    it is the app's cancel everywhere, and the footer still names it."""
    assert daemon.dsh("run", "--name", "cank", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="cank")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        call = start_call(daemon, app.feed.watched, "sleep 120")
        await until(pilot, lambda: call in call_texts(app), "the call listed")
        await pilot.press("colon", *"echo kept", "home")
        assert app.focused is app.query_one("#command")
        await pilot.press("ctrl+k")
        await until(pilot, lambda: len(app.screen_stack) > 1, "the confirmation asked")
        await confirm(pilot, app)
        await until(pilot, lambda: call not in call_texts(app), "the call cancelled")
        assert app.query_one("#command").value == "echo kept"  # not deleted to the end
        assert "^k cancel" in screen_text(app)

    run_app(app, scenario, size=(80, 24))
