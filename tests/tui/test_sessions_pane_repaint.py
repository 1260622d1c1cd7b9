"""The sessions pane's 1 s poll repaints nothing when nothing changed (issue 17, the keypress
latency: a repaint of the pane every second lands in some key's frame), nor does a lane batch
that changes nothing the session pane shows (its texts were laid out again on every batch); a
change still shows. The panes are fed plain values, as the app feeds them ``session.list``'s
answer and the lane view."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Static

from client.tui.panes import ApprovalsBar, SessionPane, SessionsPane
from protocol.methods import SessionInfo
from tests.tui.termsupport import run_async


def _sessions(running: int) -> list[SessionInfo]:
    return [SessionInfo(session_id="s-old", name="old", cwd="/srv/a", created_at=1, running=0),
            SessionInfo(session_id="s-new", name="new", cwd="/srv/b", created_at=2,
                        running=running)]


class PaneApp(App):
    def compose(self) -> ComposeResult:
        yield SessionsPane()


def test_an_unchanged_poll_repaints_nothing_and_a_change_shows():
    async def main() -> None:
        app = PaneApp()
        async with app.run_test(size=(80, 12)) as pilot:
            pane = app.query_one(SessionsPane)
            pane.show(_sessions(1))
            await pilot.pause()
            pane.move_cursor(row=1)
            await pilot.pause()
            assert not pane._repaint_required and not app.screen._dirty_widgets
            pane.show(_sessions(1))  # the same list again: the next second's poll
            assert not pane._repaint_required, "an unchanged poll repainted the pane"
            assert pane not in app.screen._dirty_widgets
            assert pane.selected_id() == "s-old"
            pane.show(_sessions(3))
            assert pane._repaint_required, "a changed cell was not redrawn"
            await pilot.pause()
            assert pane.get_cell("s-new", "status").startswith("▶3") and pane.selected_id() == "s-old"
    run_async(main)


def _lane(code: int) -> dict:
    return {"session": {"sessionId": "s-new", "cwd": "/srv/b", "approvalPolicy": "never",
                        "sandbox": "none"},
            "tools": {}, "approvals": {}, "turn": None,
            "recent": [{"callId": "c1", "name": "bash", "exitCode": code}]}


class SessionApp(App):
    def compose(self) -> ComposeResult:
        yield SessionPane()
        yield ApprovalsBar()


def test_an_unchanged_lane_batch_lays_out_and_repaints_nothing():
    async def main() -> None:
        app = SessionApp()
        async with app.run_test(size=(80, 24)) as pilot:
            pane = app.query_one(SessionPane)
            pane.show(_lane(0))
            app.query_one(ApprovalsBar).show(_lane(0))
            await pilot.pause()
            assert not app.screen._layout_required and not app.screen._dirty_widgets
            pane.show(_lane(0))  # a batch that changes nothing the pane shows
            app.query_one(ApprovalsBar).show(_lane(0))
            statics = list(pane.query(Static))
            assert not [s.id for s in statics if s._layout_required or s._repaint_required], \
                "an unchanged batch laid out or repainted the pane's texts"
            pane.show(_lane(7))
            recent = pane.query_one("#recent", Static)
            assert recent._repaint_required, "a changed result was not redrawn"
            await pilot.pause()
            assert "7" in str(recent.content)
    run_async(main)


def test_a_cell_that_grows_is_shown_whole():
    """A poll that widens a cell (a session that got its name or cwd after it was first
    listed, a last exit that became ``cancelled``) widens its column: before, the cell was
    cut to the width the column had (``alph``, ``~/w``, ``canc`` at 80 and 200 columns)."""
    async def main() -> None:
        app = PaneApp()
        async with app.run_test(size=(120, 12)) as pilot:
            pane = app.query_one(SessionsPane)
            pane.show([SessionInfo(session_id="s-1", name="", cwd="", created_at=1)])
            await pilot.pause()
            pane.show([SessionInfo(session_id="s-1", name="alpha-7", cwd="/w/x",
                                   created_at=1, last_exit="TOOL_CANCELLED")])
            await pilot.pause()
            await pilot.pause()
            row = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
            assert "alpha-7" in row and "cancelled" in row and "/w/x" in row, row
    run_async(main)
