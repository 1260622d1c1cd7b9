"""Which session ``dsh tui SESSION`` watches (a new user, in tmux): ``dsh tui nosuch`` and
``dsh tui PREFIX`` opened the newest session without a word. Now SESSION is resolved as
``dsh attach`` resolves it: a name or id that names nothing, or a prefix of several, is an
error (exit 2) before the screen starts; a unique prefix watches that session; without
SESSION, the newest session of the current directory. With dshd away at start the app
resolves once connected and says on screen what it cannot find. A watched session removed
(``dsh rm``) is said before the app moves on."""

from __future__ import annotations

from client.cli.tui import pick_session
from client.tui.app import DshApp
from tests.tui.conftest import make_daemon, run_app, until


def made(daemon, name: str, cwd) -> str:
    r = daemon.dsh("run", "--name", name, "--", "true", cwd=str(cwd))
    assert r.returncode == 0, r.stderr
    found = daemon.dsh("sessions", "--json")
    assert found.returncode == 0, found.stderr
    import json
    return next(s["sessionId"] for s in json.loads(found.stdout) if s.get("name") == name)


def messages(app: DshApp) -> list[str]:
    return [n.message for n in app._notifications]


def test_an_unknown_or_ambiguous_session_is_an_error_before_the_screen(daemon, workdir):
    made(daemon, "alpha", workdir)
    made(daemon, "alpine", workdir)
    r = daemon.dsh("tui", "nosuch", cwd=str(workdir))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "nosuch not found" in r.stderr
    r = daemon.dsh("tui", "alp", cwd=str(workdir))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "matches 2 sessions" in r.stderr and "alpha" in r.stderr and "alpine" in r.stderr


def test_a_unique_prefix_and_the_directory_pick_the_session(daemon, workdir, tui_root,
                                                            monkeypatch):
    first = made(daemon, "first", workdir)
    other = tui_root / "other"
    other.mkdir()
    made(daemon, "elsewhere", other)  # the newest, in another directory
    assert pick_session(str(daemon.socket), first[:8]) == (first, True)
    assert pick_session(str(daemon.socket), "fir") == (first, True)
    monkeypatch.chdir(workdir)
    assert pick_session(str(daemon.socket), None) == (first, True)  # this directory's newest
    empty = tui_root / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert pick_session(str(daemon.socket), None) == (None, True)  # none here: the newest


def test_dshd_away_at_start_resolves_once_connected(tui_root, workdir):
    """The prefix is resolved when dshd comes; a name that names nothing is said on screen."""
    daemon = make_daemon(tui_root)
    daemon.start()
    first = made(daemon, "first", workdir)
    newest = made(daemon, "newest", workdir)
    daemon.stop()
    # The shortest prefix of first that newest does not share (ids made in the same moment
    # share their time-based start: a fixed 6 characters named both).
    cut = next(n for n in range(1, len(first) + 1) if first[:n] != newest[:n])
    prefix = first[:max(cut, 6)]
    assert pick_session(str(daemon.socket), prefix) == (prefix, False)
    by_prefix = DshApp(socket=daemon.socket, session=prefix)
    unknown = DshApp(socket=daemon.socket, session="nosuch")

    async def prefix(pilot):
        await until(pilot, lambda: "not running" in str(pilot.app.query_one("#banner").render())
                    or pilot.app.lost_reason, "the banner")
        daemon.start()
        await until(pilot, lambda: (by_prefix.query_one("SessionPane").lane or {}).get(
            "session"), "a lane shown")
        await pilot.pause(1.5)  # a second poll: the choice holds
        assert by_prefix.feed.watched == first

    async def nosuch(pilot):
        await until(pilot, lambda: any("nosuch not found" in m for m in messages(unknown)),
                    "the unknown name said on screen")
        assert any("watching the newest" in m for m in messages(unknown))

    try:
        run_app(by_prefix, prefix)
        run_app(unknown, nosuch)
    finally:
        daemon.close()


def test_a_watched_session_removed_is_said(daemon, workdir):
    made(daemon, "keep", workdir)
    gone = made(daemon, "gone", workdir)
    app = DshApp(socket=daemon.socket, session=gone, resolve=False)

    async def scenario(pilot):
        await until(pilot, lambda: app.feed.watched == gone, "watching gone")
        await until(pilot, lambda: app._sessions, "listed")
        r = daemon.dsh("rm", "gone")
        assert r.returncode == 0, r.stderr
        await until(pilot, lambda: any(f"{gone} (gone) was removed" in m
                                       for m in messages(app)), "the removal said")
        await until(pilot, lambda: app.feed.watched not in (None, gone), "watching another")

    run_app(app, scenario)
