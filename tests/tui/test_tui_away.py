"""A typed command across a dshd restart (a new user, `make stop` in tmux): the wait cut by
dshd stopping showed "storage failure: session ... stopped (unknown error) before the
result ... was recorded" -- but the call kept running -- and its result never showed once dshd
was back. Now it says dshd went away and the command keeps running, and after the reconnect
the result shows. While dshd is away a typed line is refused and stays in the line, and `y`
says dshd is not reachable (not "nothing waits for an approval")."""

from __future__ import annotations

from client.tui.app import DshApp
from client.tui.waiting import AWAY_TEXT
from tests.tui.conftest import run_app, until
from tests.tui.helpers import call_texts


def test_a_typed_commands_result_shows_after_dshd_restarts(daemon, workdir):
    assert daemon.dsh("run", "--name", "away", "--", "true", cwd=str(workdir)).returncode == 0
    gate = workdir / "gate"
    app = DshApp(socket=daemon.socket, session="away")

    def said() -> list[str]:
        return [n.message for n in app._notifications]

    async def scenario(pilot):
        banner = app.query_one("#banner")
        command = app.query_one("#command")
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        await pilot.press("colon", *f"while [ ! -e {gate} ]; do sleep 0.05; done; "
                          "echo done-$((6*7))", "enter")
        await until(pilot, lambda: call_texts(app), "the typed command runs")
        daemon.stop()
        await until(pilot, lambda: AWAY_TEXT in said(), "dshd's going away said")
        assert not any("storage failure" in m for m in said()), said()
        await until(pilot, lambda: banner.has_class("lost"), "the banner")
        await pilot.press(*"echo kept", "enter")
        await until(pilot, lambda: any("cannot run the command" in m for m in said()),
                    "the line refused")
        assert command.value == "echo kept"
        await pilot.press("escape", "f2")  # allow once (y is the focused bar's own key)
        await until(pilot, lambda: any("cannot decide: dshd is not reachable" in m
                                       for m in said()), "y says dshd is away")
        assert not any("nothing waits" in m for m in said()), said()
        daemon.start()
        await until(pilot, lambda: not banner.has_class("lost"), "connected again")
        gate.write_text("")
        box = app.query_one("#last-result")
        await until(pilot, lambda: "done-42" in str(box.render()), "the result shown")
        assert "exit 0" in str(box.render())

    try:
        run_app(app, scenario)
    finally:
        gate.write_text("")
