"""The approvals bar shows the whole command a person approves (issue 17, tuifix2 item 2).

At 80x24 the bar cut a long command at its first line: ``sh -c "echo aaaa…; rm -rf
./important-dir-name-at-the-end"`` showed only its start. Now the command wraps in the bar;
one longer than the bar's bound ends with "… N more lines: v shows the whole command", and
``v`` opens the full text.
"""

from __future__ import annotations

import asyncio

from client.tui.app import DshApp
from client.tui.panes import ApprovalsBar
from tests.tui.conftest import run_app, screen_text, until
from tests.tui.helpers import answer, ask_from_outside

TAIL = "rm -rf ./important-dir-name-at-the-end"


def _asked(daemon, workdir, name: str):
    assert daemon.dsh("run", "--name", name, "--", "true", cwd=str(workdir)).returncode == 0
    assert daemon.dsh("policy", name, "ask").returncode == 0
    return DshApp(socket=daemon.socket, session=name)


def _flat(app) -> str:
    return " ".join(screen_text(app).split())  # wrapped rows joined: the words in order


def test_a_long_command_is_shown_whole_at_80x24(daemon, workdir):
    app = _asked(daemon, workdir, "long")
    command = f'sh -c "echo {"a" * 90}; {TAIL}"'

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        asker = ask_from_outside(daemon, app.feed.watched, command)
        try:
            bar = app.query_one(ApprovalsBar)
            await until(pilot, lambda: bar.approval is not None, "asked")
            await pilot.pause(0.3)
            await until(pilot, lambda: TAIL + '"' in _flat(app), "the command's tail on screen")
            await answer(pilot, app, "n")
            await asyncio.to_thread(asker.communicate, timeout=60)  # off the loop: the app decides
        finally:
            if asker.poll() is None:
                asker.kill()

    run_app(app, scenario, size=(80, 24))


def test_a_command_longer_than_the_bar_says_so_and_v_shows_it_all(daemon, workdir):
    app = _asked(daemon, workdir, "longer")
    words = " ".join(f"word{i:03d}" for i in range(120))
    command = f"echo {words}; {TAIL}"

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        asker = ask_from_outside(daemon, app.feed.watched, command)
        try:
            bar = app.query_one(ApprovalsBar)
            await until(pilot, lambda: bar.approval is not None, "asked")
            await until(pilot, lambda: "more lines" in _flat(app) and "press v" in _flat(app),
                        "the bar says the command goes on")
            assert TAIL not in _flat(app)
            await answer(pilot, app, "v")
            await until(pilot, lambda: TAIL in _flat(app), "the whole command shown")
            assert "word000" in _flat(app) or "word119" in _flat(app)
            await pilot.press("escape")
            await until(pilot, lambda: TAIL not in _flat(app), "back to the main screen")
            await answer(pilot, app, "n")
            await asyncio.to_thread(asker.communicate, timeout=60)  # off the loop: the app decides
        finally:
            if asker.poll() is None:
                asker.kill()

    run_app(app, scenario, size=(80, 24))
