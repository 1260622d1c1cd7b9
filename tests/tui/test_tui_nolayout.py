"""What a keystroke and a busy call's lane batches redraw in ``dsh tui`` (issue 17, a key's
frame under a flood): neither lays out the screen.

Before, Textual's ``Input`` asked for a layout of the whole screen on every key typed into
the command line, and every lane batch of a call printing output rewrote the call box's
command row with ``Static.update`` (a layout) and the session pane's title (a repaint of the
pane): under a flood, 10 layouts a second that a key's frame waited behind. Real daemon,
real calls, the app's own keys; a layout is counted where the screen performs one.
"""

from __future__ import annotations

import pytest

from client.tui.app import DshApp
from client.tui.calls import CallView
from client.tui.commandline import CommandLine
from client.tui.panes import SessionPane
from tests.tui.conftest import run_app, screen_text, until


def _count_layouts(app: DshApp) -> list[int]:
    """Count the screen's layouts from now on (``count[0]``)."""
    screen, count = app.screen, [0]
    original = screen._refresh_layout

    def counted(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    screen._refresh_layout = counted
    return count


def test_typing_in_the_command_line_lays_nothing_out_and_keeps_the_cursor_in_view(
        daemon, workdir):
    assert daemon.dsh("run", "--name", "quiet", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="quiet")
    typed = "echo " + "".join(f"w{n:03d} " for n in range(40)) + "END"  # wider than 100 cells

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one(SessionPane).lane, "the lane")
        line = app.query_one("#command", CommandLine)
        line.focus()
        await pilot.pause()
        layouts = _count_layouts(app)
        for char in typed:
            await pilot.press(char if char != " " else "space")
        await pilot.pause()
        assert line.value == typed
        # Not one per key (209 for 208 keys before): what else happens meanwhile (a poll's
        # change, the footer's bindings after the focus moved) may lay out once or twice.
        assert layouts[0] <= 3, f"{layouts[0]} layouts of the screen for {len(typed)} keys"
        bottom = screen_text(app).splitlines()
        assert any("END" in row for row in bottom), "the text scrolled: the cursor's end shows"
        assert not any("echo w000" in row for row in bottom), "its start scrolled out"

    run_app(app, scenario, size=(100, 30))


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["wide", "narrow"])
def test_a_busy_calls_lane_batches_lay_nothing_out(daemon, workdir, size):
    """Narrow: the session pane's header (id, cwd, policy, sandbox) is wider than the pane
    and shows cut with "…" -- once each batch set it whole and fit() set it cut again, two
    layouts a batch."""
    gate = workdir / "stop"
    script = (f"n=0; while [ ! -e {gate} ]; do n=$((n+1)); echo line-$n; sleep 0.01; done")
    assert daemon.dsh("run", "--name", "busy", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="busy")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one(SessionPane).lane, "the lane")
        proc = daemon.dsh_popen("run", "--name", "busy", "--", "sh", "-c", script, cwd=str(workdir))
        try:
            await until(pilot, lambda: any("line-" in v.plain for v in app.query(CallView)),
                        "the call's output shown")
            await pilot.pause(0.5)  # its box mounted and sized
            view = next(iter(app.query(CallView)))  # grown to its share: more lines than rows
            await until(pilot, lambda: view.output_lines > view.body_rows + 10, "box full")
            await pilot.pause(0.3)
            pane = app.query_one(SessionPane)
            batches, repaints = [0], [0]
            feed_lane, refresh = app.feed_lane, pane.refresh

            def counted_lane(*args):
                batches[0] += 1
                return feed_lane(*args)

            def counted_refresh(*args, **kwargs):
                repaints[0] += 1
                return refresh(*args, **kwargs)

            app.feed_lane, pane.refresh = counted_lane, counted_refresh
            layouts = _count_layouts(app)
            await until(pilot, lambda: batches[0] >= 10, "ten lane batches of the busy call")
            shown = next(iter(app.query(CallView))).plain
            assert "line-" in shown
            assert layouts[0] == 0, f"{layouts[0]} layouts for {batches[0]} lane batches"
            assert repaints[0] == 0, f"the session pane repainted {repaints[0]} times"
            if size == (80, 24):
                header = app.query_one("#session-header").render()
                assert str(header).endswith("…") or "…" in screen_text(app), \
                    "the header is cut in the narrow case (what this case is for)"
        finally:
            gate.write_text("")
            proc.wait(timeout=60)

    run_app(app, scenario, size=size)
