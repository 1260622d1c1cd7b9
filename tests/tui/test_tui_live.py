"""The TUI against a real dshd: sessions appear live, a call's output updates, an approval is
answered by a key and runs once, the daemon restarts and the TUI recovers."""

from __future__ import annotations

import asyncio

from client.tui.app import DshApp
from client.tui.panes import ApprovalsBar, SessionsPane, short_path
from tests.tui.conftest import run_app, until
from tests.tui.helpers import answer, ask_from_outside, call_texts, listed_names, log_types


def test_sessions_appear_live(daemon, workdir):
    """A session made from outside (the real `dsh run`) is listed without any key."""
    app = DshApp(socket=daemon.socket)

    async def scenario(pilot):
        await until(pilot, lambda: app.feed.client is not None, "connected")
        assert listed_names(app) == []
        r = daemon.dsh("run", "--name", "alpha", "--", "true", cwd=str(workdir))
        assert r.returncode == 0, r.stderr
        await until(pilot, lambda: "alpha" in listed_names(app), "alpha listed")
        row = app.query_one(SessionsPane).get_row("" + app.query_one(SessionsPane).selected_id())
        assert row[2] == short_path(str(workdir)) and row[1] == "0"  # cwd, last exit

    run_app(app, scenario)


def test_a_calls_output_updates_live(daemon, workdir):
    """A `dsh run` from outside prints a line, waits, prints another: the call's view shows the
    first line while the call runs, then the second, then the call moves to recent."""
    gate = workdir / "go"
    script = (f"echo first-line; while [ ! -e {gate} ]; do sleep 0.05; done; "
              "printf '\\033[31msecond-line\\033[0m\\n'; sleep 1")
    app = DshApp(socket=daemon.socket)

    async def scenario(pilot):
        await until(pilot, lambda: app.feed.client is not None, "connected")
        proc = daemon.dsh_popen("run", "--name", "beta", "--", "sh", "-c", script,
                                cwd=str(workdir))
        try:
            await until(pilot, lambda: any("first-line" in t for t in call_texts(app).values()),
                        "the first line shown")
            assert not any("second-line" in t for t in call_texts(app).values())
            gate.write_text("")
            await until(pilot, lambda: any("second-line" in t for t in call_texts(app).values()),
                        "the second line shown (its colour codes rendered, not printed)")
            await until(pilot, lambda: not call_texts(app), "the call settled")
            recent = app.query_one("SessionPane").lane["recent"]
            assert recent and recent[0]["exitCode"] == 0
        finally:
            gate.write_text("")
            proc.wait(timeout=60)

    run_app(app, scenario)


def test_an_approval_is_answered_by_a_key_and_runs_once(daemon, workdir):
    """A call asked without approval under policy ask shows in the approvals bar at once;
    `y` allows it once: the command ran exactly once and the log has one tool/result."""
    assert daemon.dsh("run", "--name", "gamma", "--", "true", cwd=str(workdir)).returncode == 0
    assert daemon.dsh("policy", "gamma", "ask").returncode == 0
    count = workdir / "count.txt"
    app = DshApp(socket=daemon.socket, session="gamma")

    async def scenario(pilot):
        bar = app.query_one(ApprovalsBar)
        await until(pilot, lambda: app.feed.watched is not None, "watching gamma")
        # The lane must be live (we are an answerer) before the call is asked.
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        asker = ask_from_outside(daemon, app.feed.watched, f"echo ran >> {count}")
        try:
            await until(pilot, lambda: bar.approval is not None, "the approvals bar")
            assert bar.has_class("asking") and f"echo ran >> {count}" in str(
                bar.approval[1]["summary"])
            await answer(pilot, app, "y")
            # Off the loop: the app's worker must send the decision while the asker waits.
            out, err = await asyncio.to_thread(asker.communicate, timeout=60)
        finally:
            if asker.poll() is None:
                asker.kill()
        call_id, exit_code, error_code = out.split()
        assert (exit_code, error_code) == ("0", "None"), err
        await until(pilot, lambda: not bar.has_class("asking"), "the bar hidden again")
        return call_id, app.feed.watched

    holder = {}

    async def keep(pilot):
        holder["call"], holder["session"] = await scenario(pilot)

    run_app(app, keep)
    assert count.read_text() == "ran\n"  # exactly once
    events = log_types(daemon.socket, holder["session"])
    results = [e for e in events if e == ("tool/result", holder["call"])]
    assert len(results) == 1


def test_the_daemon_restarts_and_the_tui_recovers(daemon, workdir):
    """dshd stops while a call runs: the banner says so; dshd starts again on the same socket:
    the banner goes, the running call's live view resumes (its next line shows, the first
    once), and a call made afterwards appears."""
    gate, end = workdir / "go", workdir / "end"
    script = (f"echo before-restart; while [ ! -e {gate} ]; do sleep 0.05; done; "
              f"echo after-restart; while [ ! -e {end} ]; do sleep 0.05; done")
    app = DshApp(socket=daemon.socket)

    async def scenario(pilot):
        banner = app.query_one("#banner")
        proc = daemon.dsh_popen("run", "--name", "delta", "--", "sh", "-c", script,
                                cwd=str(workdir))
        try:
            await until(pilot, lambda: any("before-restart" in t
                                           for t in call_texts(app).values()), "the call shown")
            assert not banner.has_class("lost")
            daemon.stop()
            await until(pilot, lambda: banner.has_class("lost"), "the banner shown")
            assert "dshd is not reachable" in str(banner.render())
            daemon.start()
            await until(pilot, lambda: not banner.has_class("lost"), "the banner gone")
            gate.write_text("")
            await until(pilot, lambda: any("after-restart" in t
                                           for t in call_texts(app).values()),
                        "the resumed view shows the line written after the restart")
            shown = next(iter(call_texts(app).values()))
            assert shown.count("before-restart") == 1, shown  # resumed, not replayed twice
        finally:
            gate.write_text("")
            end.write_text("")
            proc.wait(timeout=60)
        r = daemon.dsh("run", "--name", "after", "--", "echo", "back", cwd=str(workdir))
        assert r.returncode == 0, r.stderr
        await until(pilot, lambda: "after" in listed_names(app), "a new session after it")
        assert app.feed.connects >= 2

    run_app(app, scenario)


def test_the_tui_starts_before_dshd_and_connects_when_it_comes(tui_root, workdir):
    from tests.tui.conftest import make_daemon

    daemon = make_daemon(tui_root)
    app = DshApp(socket=daemon.socket)

    async def scenario(pilot):
        banner = app.query_one("#banner")
        await until(pilot, lambda: "not running" in str(banner.render()), "the banner says why")
        daemon.start()
        await until(pilot, lambda: not banner.has_class("lost"), "connected")
        assert daemon.dsh("run", "--name", "late", "--", "true").returncode == 0
        await until(pilot, lambda: "late" in listed_names(app), "listed")

    try:
        run_app(app, scenario)
    finally:
        daemon.close()


def test_a_command_typed_on_the_command_line_runs_and_shows_its_result(daemon, workdir):
    assert daemon.dsh("run", "--name", "cmd", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="cmd")

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        await pilot.press("colon", *"echo typed-$((6*7)) > out.txt; cat out.txt", "enter")
        box = app.query_one("#last-result")
        await until(pilot, lambda: box.has_class("shown"), "the result shown")
        shown = str(box.render())
        assert "typed-42" in shown and "exit 0" in shown
        pane = app.query_one("SessionPane")
        await until(pilot, lambda: len(pane.lane["recent"]) == 2, "in recent")
        assert pane.lane["recent"][0]["exitCode"] == 0

    run_app(app, scenario)
    assert (workdir / "out.txt").read_text() == "typed-42\n"  # ran once, in the session's cwd


def test_reject_never_runs_and_allow_for_session_stops_asking(daemon, workdir):
    """`n` rejects: the command never runs. `a` allows for the session: the call runs, and the
    same command asked again runs without a request in the bar."""
    assert daemon.dsh("run", "--name", "eps", "--", "true", cwd=str(workdir)).returncode == 0
    assert daemon.dsh("policy", "eps", "ask").returncode == 0
    bad, good = workdir / "bad.txt", workdir / "good.txt"
    app = DshApp(socket=daemon.socket, session="eps")

    async def ask_and_answer(pilot, command, key):
        bar = app.query_one(ApprovalsBar)
        asker = ask_from_outside(daemon, app.feed.watched, command)
        try:
            if key is not None:
                await until(pilot, lambda: bar.approval is not None, "asked")
                await answer(pilot, app, key)
            # Off the loop: the app's worker must send the decision while the asker waits.
            out, err = await asyncio.to_thread(asker.communicate, timeout=60)
        finally:
            if asker.poll() is None:
                asker.kill()
        assert asker.returncode == 0, err
        return out.split()[1:]

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        assert await ask_and_answer(pilot, f"echo no > {bad}", "n") == ["None", "APPROVAL_REJECTED"]
        assert await ask_and_answer(pilot, f"echo yes >> {good}", "a") == ["0", "None"]
        # The session's rule answers the same command: nobody is asked (no key pressed).
        assert await ask_and_answer(pilot, f"echo yes >> {good}", None) == ["0", "None"]
        assert app.query_one(ApprovalsBar).approval is None

    run_app(app, scenario)
    assert not bad.exists()
    assert good.read_text() == "yes\nyes\n"


def test_the_session_named_at_start_is_the_one_watched(daemon, workdir):
    """`dsh tui build` watches build even when newer sessions exist (a new user's
    `dsh tui build` watched the newest session instead: the first poll moved the cursor, read
    it back before the move took effect, and never tried again)."""
    for name in ("build", "docs", "newest"):
        assert daemon.dsh("run", "--name", name, "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="build")

    async def scenario(pilot):
        await until(pilot, lambda: (app.query_one("SessionPane").lane or {}).get("session"),
                    "a lane shown")
        await pilot.pause(1.5)  # a second poll: the choice must hold
        pane = app.query_one("SessionPane")
        assert pane.lane["session"]["name"] == "build"
        assert app.query_one(SessionsPane).selected_id() == app.feed.watched

    run_app(app, scenario)
