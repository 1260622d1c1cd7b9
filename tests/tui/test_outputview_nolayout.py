"""A redraw of new output repaints the OutputView alone (issue 17, the keypress latency under
a flood): the view's scrollable size follows its lines without a layout of the screen (a
layout on every redraw cost a flood's frames tens of ms, which a key's frame waited behind),
and the scroll and the bottom still follow the new lines (the scrollbar shows only once
scrolled back). Real daemon, real call; the
bytes are handed to the view the way its follow hands them (``_receive``)."""

from __future__ import annotations

from client.api import connect
from client.tui.outputview import OutputView
from tests.e2e.conftest import daemon, workdir  # noqa: F401 - fixtures
from tests.tui.termsupport import run_async, screen_lines, until
from tests.tui.test_outputview_yield import ViewAndLabel


def test_new_lines_resize_the_scroll_without_a_layout_and_show(daemon, workdir):
    async def main() -> None:
        async with connect(daemon.socket) as client:
            sid = await client.create_session(workdir)
            cid = await client.run_tool(sid, "seq 1 3")
            await client.wait(sid, cid)
            view = OutputView(client, sid, cid)
            app = ViewAndLabel(view)
            async with app.run_test(size=(60, 12)) as pilot:
                await until(lambda: view.ended, "the short call followed", pilot=pilot)
                view._receive(view.position, b"".join(b"first-%d\n" % n for n in range(20)))
                view._apply_pending()  # taller than the view: it scrolls
                await pilot.pause()
                # Following the end it shows no scrollbar (drawn again on every redraw).
                assert not view.show_vertical_scrollbar and not app.screen._layout_required
                fresh = b"".join(b"line-%d\n" % n for n in range(40))
                view._receive(view.position, fresh)
                view._apply_pending()
                assert not app.screen._layout_required, "a redraw of output laid out the screen"
                assert not view._layout_required
                assert view.virtual_size.height == len(view.window)
                assert view.max_scroll_y == len(view.window) - view.scrollable_content_region.height
                await until(lambda: any("line-39" in line for line in screen_lines(view)),
                            "the newest line shown at the bottom", pilot=pilot)
                view.action_home_older()
                await pilot.pause()
                assert any(line.strip() == "1" for line in screen_lines(view)), \
                    "scrolled to the top of the window"
                assert view.show_vertical_scrollbar, "scrolled back: the scrollbar shows"
                assert view.vertical_scrollbar.window_virtual_size == len(view.window)
                assert view.vertical_scrollbar.position == 0
    run_async(main)
