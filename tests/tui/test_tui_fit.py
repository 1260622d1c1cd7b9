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
    got = share(18, header=2, busy=True, result=6, recent=9, turn=9)
    assert got.calls >= CALLS_MIN and got.turn >= TURN_MIN
    assert got.calls + got.result + got.recent + got.turn == 16
    assert got.recent < 9  # the recent list shrank
    roomy = share(60, header=1, busy=True, result=6, recent=9, turn=9)
    assert (roomy.result, roomy.recent, roomy.turn) == (6, 9, 9)  # all of each, room left
    assert roomy.calls == 60 - 1 - 6 - 9 - 9
    idle = share(18, header=2, busy=False, result=0, recent=3, turn=3)
    assert (idle.recent, idle.turn) == (3, 3)


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
