"""The result of a command typed on the command line (``#last-result``), against a real dshd:
it belongs to the session it ran in, and it shows the END of the output as a terminal leaves
it. A new user saw `echo THIS-RAN-IN-P20`'s result in every session watched afterwards;
`seq 1 20` showed `9 10 11 12` (the first rows of the last 12 lines, cut by the row share);
a 5 MB line pushed `END` out; a progress bar showed its first ``\\r`` state."""

from __future__ import annotations

from client.tui.app import DshApp
from client.tui.panes import SessionsPane
from tests.tui.conftest import run_app, until


def result_shown(app: DshApp) -> str:
    box = app.query_one("#last-result")
    return str(box.render()) if box.has_class("shown") and box.display else ""


async def watch(pilot, app: DshApp, name: str) -> None:
    pane = app.query_one(SessionsPane)
    sid = next(s.session_id for s in app._sessions if s.name == name)
    assert pane.select(sid)
    await until(pilot, lambda: ((app.query_one("SessionPane").lane or {}).get("session")
                                or {}).get("name") == name, f"{name} watched")
    await pilot.pause(0.2)


async def typed(pilot, app: DshApp, command: str, shown: str) -> str:
    """Type ``command``; its result once it shows (its header line ends in ``shown``)."""
    await pilot.press("escape", "colon", *command, "enter")
    pane = app.query_one("SessionPane")
    await until(pilot, lambda: pane._result and pane._result[0].plain == f"$ {command}{shown}",
                f"the result of {command!r}: {pane._result and pane._result[0].plain!r} "
                f"{[n.message for n in app._notifications]}")
    await pilot.pause(0.2)
    return result_shown(app)


def test_a_typed_result_shows_only_in_its_own_session(daemon, workdir):
    for name in ("p19", "p20"):
        assert daemon.dsh("run", "--name", name, "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="p20")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        await typed(pilot, app, "echo THIS-RAN-IN-P20", " → exit 0")
        await pilot.press("escape")
        await watch(pilot, app, "p19")
        assert "THIS-RAN-IN-P20" not in result_shown(app)
        await typed(pilot, app, "echo in-p19", " → exit 0")
        assert "THIS-RAN-IN-P20" not in result_shown(app)
        await pilot.press("escape")
        await watch(pilot, app, "p20")  # back: its own result again, not p19's
        await until(pilot, lambda: "THIS-RAN-IN-P20" in result_shown(app), "p20's result")
        assert "in-p19" not in result_shown(app)

    run_app(app, scenario, size=(80, 24))


def test_a_typed_result_shows_the_end_of_its_output(daemon, workdir):
    assert daemon.dsh("run", "--name", "out", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="out")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        shown = await typed(pilot, app, "seq 1 20", " → exit 0")
        lines = [line.strip() for line in shown.splitlines()[1:]]
        assert lines and lines[-1] == "20", shown  # the last line, whatever rows it got
        assert lines == [str(n) for n in range(21 - len(lines), 21)], shown
        shown = await typed(pilot, app, 'head -c 5000000 /dev/zero | tr "\\0" a; echo; echo END',
                            " → exit 0")
        assert shown.splitlines()[-1].strip() == "END", shown
        assert all(len(line) <= 80 for line in shown.splitlines()), shown  # cut, not wrapped
        shown = await typed(pilot, app, "printf 'downloading 1%% [#\\rdownloading 100%% [##]\\n'",
                            " → exit 0")
        assert "downloading 100% [##]" in shown and "1% [#" not in shown, shown

    run_app(app, scenario, size=(80, 24))
