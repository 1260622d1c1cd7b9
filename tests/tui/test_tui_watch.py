"""The watched session is held by its id across polls: ``dsh tui build`` with unnamed sessions
after it in the list watched the last unnamed one (the pick went on after the match, and
``None``, the cleared wish, matched every missing name); rows added, removed or reordered keep
the cursor on the watched session's row."""

from __future__ import annotations

from client.tui.app import DshApp
from client.tui.panes import SessionsPane
from protocol.methods import SessionInfo
from tests.tui.conftest import run_app


def info(sid: str, created: int, name: str | None = None) -> SessionInfo:
    return SessionInfo(session_id=sid, name=name, cwd="/tmp", running=0, pending_approvals=0,
                       last_exit=None, created_at=created)


def test_the_named_session_stays_watched_while_rows_come_and_go():
    app = DshApp(connect=False, session="build")
    build = info("s-build", 1, "build")

    async def scenario(pilot):
        table = app.query_one(SessionsPane)
        for sessions in ([build, info("s-2", 2), info("s-3", 3)],
                         [build, info("s-2", 2), info("s-3", 3)],  # the next poll
                         [info("s-4", 4), build, info("s-3", 3)],  # one added, one removed
                         [info("s-0", 0), build, info("s-4", 4)]):  # an older one first
            app.feed_sessions(sessions)
            await pilot.pause()
            assert table.selected_id() == "s-build", [str(k.value) for k in table.rows]
            assert app.feed.watched == "s-build"

    run_app(app, scenario, size=(80, 24))
