"""The sessions pane's 1 s poll repaints nothing when nothing changed (issue 17, the keypress
latency: a repaint of the pane every second lands in some key's frame); a changed cell still
shows. The pane is fed plain ``SessionInfo`` values, as the app feeds it ``session.list``'s."""

from __future__ import annotations

from textual.app import App, ComposeResult

from client.tui.panes import SessionsPane
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
            assert pane.get_cell("s-new", "run") == "3" and pane.selected_id() == "s-old"
    run_async(main)
