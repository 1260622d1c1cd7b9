"""The smaller findings of issue 17's new user (tuifix2 item 7): the "command ended" popup
went on covering the input for 30 s; the attach screen did not say how to detach (and, once
the command ended, still said how to detach instead of how to return); at 200
columns the sessions pane took 80 of them; the banner's advice sat in nested brackets."""

from __future__ import annotations

from textual.widgets import Static

from client.api import connect
from client.tui.app import DshApp
from client.tui.panes import SessionsPane
from client.tui.term import TerminalScreen
from tests.e2e.conftest import daemon, workdir  # noqa: F401 - fixtures
from tests.tui.conftest import run_app
from tests.tui.termsupport import ScreenHostApp, run_async, terminal_text, until


def test_the_attach_screen_says_how_to_detach_and_the_end_popup_goes(daemon, workdir):
    async def main() -> None:
        async with connect(daemon.socket) as client:
            sid = await client.create_session(workdir)
            cid = (await client.start_tool(sid, "printf 'ready\\n'; read -r l; exit 137",
                                           tty=(80, 24))).call_id
            screen = TerminalScreen(client, sid, cid)
            app = ScreenHostApp(screen)
            async with app.run_test(size=(80, 24)) as pilot:
                await until(lambda: "ready" in terminal_text(screen.terminal), "ready",
                            pilot=pilot)
                footer = str(screen.query_one("#attach-footer", Static).render())
                assert "ctrl+p ctrl+q detaches" in footer.lower().replace("-", "+"), footer
                await pilot.press("enter")
                await until(lambda: screen.terminal.ended, "the call ended", pilot=pilot)
                # Ended: the detach keys mean nothing now, the footer says how to return.
                footer = await until(lambda: "ended" in (text := str(screen.query_one(
                    "#attach-footer", Static).render())) and text, "the footer of the end",
                    pilot=pilot)
                assert "any key returns" in footer and "exit 137" in footer, footer
                assert "detaches" not in footer, footer
                await until(lambda: any("exit 137" in n.message for n in app._notifications),
                            "the popup", pilot=pilot)
                assert all(n.timeout <= 3 for n in app._notifications)
                await pilot.press("x")
                await until(lambda: app.results == ["ended"], "returned", pilot=pilot)
                await until(lambda: not any("exit 137" in n.message
                                            for n in app._notifications),
                            "the popup gone with the key", timeout=1.0, pilot=pilot)
    run_async(main)


def test_the_sessions_pane_is_capped_at_200_columns():
    app = DshApp(connect=False)

    async def scenario(pilot):
        await pilot.pause(0.2)
        assert app.query_one(SessionsPane).outer_size.width <= SessionsPane.WIDE_MAX  # not 80

    run_app(app, scenario, size=(200, 60))


def test_the_banner_is_one_plain_sentence():
    app = DshApp(connect=False)

    async def scenario(pilot):
        app.feed_lost("dshd is not running at /run/dsh/dshd.sock; start it with `dshd` "
                      "(or `systemctl --user start dshd`)", 1)
        await pilot.pause(0.1)
        text = str(app.query_one("#banner", Static).render())
        assert "`" not in text and "(" not in text and ")" not in text, text
        assert "dshd is not running at /run/dsh/dshd.sock" in text
        assert "dshd &" in text and "running calls keep running" in text
        assert text.rstrip().endswith(".") and text.count(". ") == 0, text

    run_app(app, scenario)
