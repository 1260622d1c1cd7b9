"""The approval decision keys answer only what a person meant to answer (an outside attacker's
findings). ``y`` / ``a`` / ``n`` were app-wide letters and the TUI starts with the focus on
the sessions list: typing ``make all`` there made an allow-for-session rule (``a``). And
pressing ``y`` twice approved the next request unseen: it shows ~100 ms after the first is
decided, and a double tap or a key repeat landed on it. Now the letters are the approvals
bar's own keys (it must have the focus), and a request is armed only once it has been shown
for ``ARM_S``; the cancel confirm (``c``) is armed the same way, so ``cycle`` typed into the
sessions list confirms nothing."""

from __future__ import annotations

import time

from client.tui.app import DshApp
from client.tui.approvals import ARM_S, ApprovalsBar
from client.tui.confirm import ConfirmScreen
from tests.tui.conftest import run_app, until
from tests.tui.helpers import answer, ask_from_outside, call_texts
from tests.tui.test_tui_cancel import start_call


def _kill(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_letters_typed_outside_the_bar_decide_nothing(daemon, workdir):
    assert daemon.dsh("run", "--name", "keys", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="keys")
    procs = []

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        running = start_call(daemon, app.feed.watched, "sleep 120")
        await until(pilot, lambda: running in call_texts(app), "the call listed")
        procs.append(ask_from_outside(daemon, app.feed.watched, "echo asked"))
        bar = app.query_one(ApprovalsBar)
        await until(pilot, lambda: bar.approval is not None and bar.armed(), "asked, armed")
        assert app.focused is app.query_one("#sessions")
        await pilot.press(*"make", "space", *"all", "space", *"yan")
        await pilot.pause(0.5)
        assert procs[0].poll() is None, "a letter typed in the sessions list decided"
        assert bar.approval is not None
        # c opens the confirm; the next letters of the word neither confirm nor cancel.
        app.screen.set_focus(app.query_one("#sessions"))
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirm")
        confirm = app.screen
        await pilot.press("y")  # the next letter of "cycle", typed at once: not armed
        on_time = time.monotonic() - confirm.shown_at < ARM_S
        if on_time:  # (on a machine too loaded the y comes late, armed: it proves nothing)
            await pilot.pause(0.1)
            assert app.screen is confirm and running in call_texts(app)
        await pilot.press(*"cle")  # the rest of "cycle": no
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "closed")
        await pilot.pause(0.5)
        assert running in call_texts(app), "the y typed after c confirmed the cancel"
        if procs[0].poll() is not None:
            # A late y confirmed the cancel of the selected call: the asking one (CI, loaded).
            out, _ = procs[0].communicate(timeout=30)
            assert not on_time and "APPROVAL_CANCELLED" in out, out
            procs.append(ask_from_outside(daemon, app.feed.watched, "echo asked again"))
            await until(pilot, lambda: bar.approval is not None and bar.armed(), "asked again")
        await answer(pilot, app, "n")  # the bar focused: its key decides
        await until(pilot, lambda: procs[-1].poll() is not None, "the asker answered")
        out, _ = procs[-1].communicate(timeout=30)
        assert "APPROVAL_REJECTED" in out

    try:
        run_app(app, scenario, size=(100, 30))
    finally:
        _kill(procs)


def test_a_double_tap_decides_one_request_and_the_next_waits_to_be_read(daemon, workdir):
    assert daemon.dsh("run", "--name", "tap", "--", "true", cwd=str(workdir)).returncode == 0
    app = DshApp(socket=daemon.socket, session="tap")
    procs = []

    async def scenario(pilot):
        await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
        bar = app.query_one(ApprovalsBar)
        procs.append(ask_from_outside(daemon, app.feed.watched, "echo first"))
        await until(pilot, lambda: bar.approval is not None, "the first asked")
        procs.append(ask_from_outside(daemon, app.feed.watched, "echo second"))
        await until(pilot, lambda: len(app.query_one("SessionPane").lane.get("approvals")
                                       or {}) == 2, "both pending")
        await pilot.press("f6")
        await until(pilot, lambda: bar.has_focus_within and bar.armed(), "the first armed")
        assert "echo first" in str(bar.approval[1]["summary"])
        await pilot.press("y", "y")
        await until(pilot, lambda: procs[0].poll() is not None, "the first decided")
        await until(pilot, lambda: bar.approval is not None
                    and "echo second" in str(bar.approval[1]["summary"]), "the second shown")
        await pilot.pause(0.2)
        assert procs[1].poll() is None, "the second tap decided the next request unseen"
        await answer(pilot, app, "y")  # the focus went back when the bar hid: f6 again
        await until(pilot, lambda: procs[1].poll() is not None, "the second decided")
        for proc in procs:
            out, _ = proc.communicate(timeout=30)
            assert out.split()[1:] == ["0", "None"], out  # allowed once: it ran

    try:
        run_app(app, scenario, size=(100, 30))
    finally:
        _kill(procs)
