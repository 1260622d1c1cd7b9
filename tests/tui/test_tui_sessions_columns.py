"""The sessions pane shows what matters at each width (a new user's finding: its ``ask``,
``exit`` and ``cwd`` columns never showed, the pane being 40 cells at most and only name and
``run`` fitting at 80 columns; 20 sessions titled ``true`` could not be told apart)."""

from __future__ import annotations

from protocol.methods import SessionInfo
from client.tui.app import DshApp
from client.tui.panes import SessionsPane
from tests.tui.conftest import run_app, screen_text

SESSIONS = [SessionInfo(session_id=f"s-{n:02d}", title="true", cwd=f"/srv/proj/dir{n:02d}",
                        running=1 if n == 3 else 0, pending_approvals=2 if n == 3 else 0,
                        last_exit=n % 2, updated_at=n, created_at=n) for n in range(20)]


def pane_rows(app: DshApp) -> list[str]:
    width = app.query_one(SessionsPane).outer_size.width
    return [line[:width] for line in screen_text(app).splitlines()]


def test_at_80_columns_each_session_shows_its_status_and_can_be_told_apart():
    app = DshApp(connect=False)

    async def scenario(pilot):
        app.feed_sessions(SESSIONS)
        await pilot.pause(0.3)
        rows = pane_rows(app)
        busy = next(row for row in rows if "dir03" in row)
        assert "▶1" in busy and "!2" in busy and " 1" in busy, rows  # running, asks, exit
        labels = [row.split("│")[1].split("▶")[0].strip() for row in rows
                  if "true" in row]
        assert len(labels) >= 10 and len(set(labels)) == len(labels), rows

    run_app(app, scenario, size=(80, 24))


def test_at_200_columns_the_pane_is_wider_and_shows_the_cwd():
    app = DshApp(connect=False)

    async def scenario(pilot):
        app.feed_sessions(SESSIONS)
        await pilot.pause(0.3)
        assert app.query_one(SessionsPane).outer_size.width > 40
        rows = pane_rows(app)
        assert any("/srv/proj/dir03" in row for row in rows), rows

    run_app(app, scenario, size=(200, 60))
