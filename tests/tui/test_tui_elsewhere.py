"""A request of a session the TUI does not watch is named on the approvals bar, and ``j``
watches that session so it can be answered. Before, only the watched session's requests
showed: the other one's waited with a count in the ``ask`` column and nothing said what it
asked or how to get there."""

from __future__ import annotations

import subprocess
import sys

from client.tui.app import DshApp
from client.tui.panes import ApprovalsBar, SessionsPane
from tests.tui.conftest import run_app, screen_text, until
from tests.tui.helpers import answer, ask_from_outside

#: Another answerer of session argv[1] (subscribed, approvals declared) that never answers:
#: it keeps the request pending, as a web page left open would.
HOLDER = r"""
import sys, trio
from client.api import connect
async def main(session):
    async with connect(None, "holder", approvals=True) as c:
        sub = await c.subscribe(session)
        print("subscribed", flush=True)
        async for _ in sub:
            pass
trio.run(main, sys.argv[1])
"""


def test_another_sessions_request_is_named_and_j_watches_it(daemon, workdir):
    for name in ("there", "here"):
        r = daemon.dsh("run", "--name", name, "--", "true", cwd=str(workdir))
        assert r.returncode == 0, r.stderr
    app = DshApp(socket=daemon.socket, session="here")
    procs: list[subprocess.Popen] = []

    async def scenario(pilot):
        table = app.query_one(SessionsPane)
        await until(pilot, lambda: app.feed.watched and app.query_one("SessionPane").lane,
                    "here watched")
        here = app.feed.watched
        there = next(str(k.value) for k in table.rows if table.get_row(k)[0] == "there")
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, there], env=daemon.env,
                                  stdout=subprocess.PIPE, text=True)
        procs.append(holder)
        assert holder.stdout.readline().strip() == "subscribed"
        procs.append(ask_from_outside(daemon, there, "echo asked-in-there"))
        bar = app.query_one(ApprovalsBar)
        await until(pilot, lambda: bar.elsewhere is not None, "the other request named")
        await until(pilot, lambda: "there asks: echo asked-in-there" in screen_text(app),
                    "the session and its command on the bar")
        assert "j watch it" in screen_text(app)
        assert app.feed.watched == here and bar.approval is None  # not answerable here
        await pilot.press("j")
        await until(pilot, lambda: app.feed.watched == there, "j watches there")
        assert table.selected_id() == there
        await until(pilot, lambda: bar.approval is not None, "its request, answerable")
        await answer(pilot, app, "y")
        await until(pilot, lambda: procs[1].poll() is not None, "the asker got its result")
        out, _ = procs[1].communicate(timeout=30)
        assert out.split()[1:] == ["0", "None"], out  # allowed once: it ran, exit 0
        await until(pilot, lambda: bar.elsewhere is None and bar.approval is None,
                    "nothing asks any more")

    try:
        run_app(app, scenario, size=(80, 24))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
