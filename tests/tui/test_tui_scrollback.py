"""Scroll-back in a call's box of ``dsh tui`` (a new user's report): Tab to the box (its
border turns double), Page Up, then Up Up Up: the box kept following the end, as the focus
was on the ``CallView`` and the keys went past its ``OutputView`` to the pane's scroll. Now
the focused box's keys scroll its output: Page Up/Up/Home go back and stay there while the
call goes on printing, End follows the end again. Against a real dshd, a call printing a
line every 20 ms."""

from __future__ import annotations

from client.tui.app import DshApp
from client.tui.calls import CallView
from tests.tui.conftest import run_app, until
from tests.tui.termsupport import screen_lines
from tests.tui.test_tui_cancel import start_call

TICKER = "i=0; while [ $i -lt 30000 ]; do i=$((i+1)); echo line-$i; sleep 0.02; done"


def shown(view) -> list[int]:
    return [int(t.strip()[5:]) for t in screen_lines(view) if t.strip().startswith("line-")]


def test_the_focused_box_scrolls_back_and_stays_while_output_goes_on(daemon, workdir):
    assert daemon.dsh("run", "--name", "scroll", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="scroll")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        call = start_call(daemon, app.feed.watched, TICKER)
        box = await until(pilot, lambda: app.query(f"#call-{call}").first(CallView)
                          if app.query(f"#call-{call}") else None, "the call's box")
        view = box.live
        assert view is not None, "a running call of the watched session shows live"
        rows = await until(pilot, lambda: len(shown(view)) >= 4 and shown(view)[-1] > 60
                           and view.size.height, "a few screens of output")
        for _ in range(6):  # Tab along the panes until the box holds the focus
            if box.has_focus or box.has_focus_within:
                break
            await pilot.press("tab")
        assert box.has_focus or box.has_focus_within, app.focused
        # Following the end, the box shows no scrollbar (Textual drew it again on every
        # redraw of new output); scrolled back it does, and the keys scroll either way.
        assert view.following and not view.show_vertical_scrollbar
        await pilot.press("pageup", "up", "up", "up")
        before = await until(pilot, lambda: shown(view), "lines shown")
        last = before[-1]
        await until(pilot, lambda: view.position is not None and view.window.lines
                    and view.window.text(len(view.window) - 1).startswith("line-")
                    and int(view.window.text(len(view.window) - 1)[5:]) > last + 3 * rows,
                    "three more pages of output received")
        await pilot.pause(0.2)
        assert shown(view) == before, "the box went on following the end"
        assert not view.following
        assert view.show_vertical_scrollbar, "scrolled back: the scrollbar shows where"
        await pilot.press("end")
        await until(pilot, lambda: shown(view) and shown(view)[-1] > last + 3 * rows
                    and view.following, "End follows the end again")
        assert not view.show_vertical_scrollbar
        await pilot.press("home")
        await until(pilot, lambda: shown(view)[:1] == [1], "Home: the first line")
        top = shown(view)
        await pilot.pause(0.3)
        assert shown(view) == top, "Home did not stay"
        await app.feed.client.cancel(app.feed.watched, call)

    run_app(app, scenario)
