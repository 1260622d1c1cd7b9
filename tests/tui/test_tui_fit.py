"""At 80x24 the running calls' output and the turn's streaming text keep their rows: the
recent results and the last typed result give theirs up first (``client.tui.fit``). Before,
each part was as tall as its text and a running call's box got no output rows, and the end
of the turn's text was pushed off the screen."""

from __future__ import annotations

import copy

from client.tui.app import DshApp
from client.tui.calls import CallView
from client.tui.fit import CALLS_MIN, TURN_MIN, share
from tests.tui import screens
from tests.tui.conftest import run_app, screen_text


def test_the_calls_and_the_turn_keep_their_rows_and_recent_shrinks_first():
    got = share(18, header=2, calls=[40], result=6, recent=9, turn=9)
    assert got.calls >= CALLS_MIN and got.turn >= TURN_MIN
    assert got.calls + got.result + got.recent + got.turn == 16
    assert got.recent < 9  # the recent list shrank
    roomy = share(60, header=1, calls=[20], result=6, recent=9, turn=9)
    assert (roomy.bodies, roomy.result, roomy.recent, roomy.turn) == ((20,), 6, 9, 9)
    flood = share(60, header=1, calls=[1000], result=6, recent=9, turn=9)
    assert flood.calls == 60 - 1 - 6 - 6 - 9  # the rest: the call's output first
    idle = share(18, header=2, calls=[], result=0, recent=3, turn=3)
    assert (idle.recent, idle.turn) == (3, 3)


def test_blank_rows_go_to_what_has_more_to_show():
    """A new user at 200x60: a box kept 12 output lines with 14-30 blank rows below; at
    80x24 the recent list shrank to its heading alone next to blank rows."""
    tall = share(56, header=1, calls=[500], result=0, recent=21, turn=2)
    assert sum((tall.calls, tall.recent, tall.turn)) == 55  # no blank row
    assert tall.bodies[0] > 12 and tall.recent >= 2
    short = share(56, header=1, calls=[3], result=0, recent=21, turn=2)
    assert short.bodies == (3,) and short.recent == 21  # the box's 3 lines; recent the rest
    for height in range(3, 30):  # never a heading alone
        for calls in ([], [50], [50, 50]):
            got = share(height, 1, calls, result=5, recent=9, turn=6)
            assert got.recent == 0 or got.recent >= 2, (height, calls, got)
            assert got.calls + got.result + got.recent + got.turn <= height - 1


def test_a_box_always_has_an_output_row_else_it_is_counted_as_more():
    for height in range(1, 40):
        got = share(height, 1, [50, 50, 50], result=0, recent=3, turn=6)
        assert all(body >= 1 for body in got.bodies), (height, got)
        assert got.more == (1 if len(got.bodies) < 3 else 0), (height, got)
        assert got.calls + got.recent + got.turn <= height - 1, (height, got)
    two = share(18, 1, [50, 50], result=0, recent=3, turn=6)  # 80x24, two running calls
    assert len(two.bodies) == 2 or two.more == 1, two


def test_at_80x24_a_calls_output_and_the_end_of_the_turns_text_show():
    lane = copy.deepcopy(screens.LANE)
    del lane["tools"]["c-ask"], lane["approvals"]["ap-1"]
    lane["tools"]["c-make"]["output"]["content"][0]["text"] = "".join(
        f"out-{i}\n" for i in range(40))
    lane["recent"] = [dict(lane["recent"][0], callId=f"c-{i}") for i in range(8)]
    lane["turn"]["text"] = " ".join(f"word{i}" for i in range(120)) + " THE-END"
    app = DshApp(connect=False)

    async def scenario(pilot):
        app.feed_sessions(screens.SESSIONS)
        app.feed.watched = "s-build"
        await pilot.pause(0.1)
        app.feed_lane("s-build", lane)
        await pilot.pause(0.2)
        app.feed_lane("s-build", lane)  # laid out: the pane's size is known
        await pilot.pause(0.2)
        text = screen_text(app)
        shown = [f"out-{i}" for i in range(40) if f"out-{i}\n" in text + "\n"
                 or f"out-{i} " in text]
        assert len(shown) >= 3 and "out-39" in shown, text  # the newest lines of the call
        assert "THE-END" in text and "turn t-1" in text, text  # the turn's header and end
        assert app.query_one(CallView).body_rows >= 3

    run_app(app, scenario, size=(80, 24))
