"""How the session pane's rows are shared: the running calls and the turn first.

Theory of operation: the session pane (``client.tui.panes.SessionPane``) stacks its header, the running calls' boxes, the last
typed command's result, the recent results and the turn. At 80x24 there are about 18 rows
for all of them, and with each part as tall as its text the calls got none (a running call's
box showed its border and no output) and the turn's text was pushed off. :func:`share` is
the rule, a pure function of row counts: the header keeps its rows; running calls get
``CALLS_MIN`` (a box's border, its command and ``CALL_BODY_MIN`` output lines); the turn gets
up to ``TURN_MIN`` rows; then, from what is left, the last result (up to ``RESULT_MAX``), the
rest of the turn (up to ``TURN_MAX``), the recent results (up to ``RECENT_MAX``; they are the
ones that shrink first), and whatever remains goes to the calls. No part gets more rows than
its text needs; a part that gets fewer shows the rows that matter (the recent list its newest entries, the turn its header and the end of
its streaming text: ``client.tui.panes``).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Share", "share", "CALL_CHROME", "CALL_BODY_MIN", "CALLS_MIN", "TURN_MIN",
           "TURN_MAX", "RESULT_MAX", "RECENT_MAX"]

#: Rows of a call's box that are not output: its border (2), its command (1), its margin (1).
CALL_CHROME = 4
#: Output rows a running call's box always keeps.
CALL_BODY_MIN = 4
#: The rows the running calls keep, whatever else asks.
CALLS_MIN = CALL_CHROME + CALL_BODY_MIN
#: The rows the turn keeps (its border, its header line, the end of its text).
TURN_MIN = 5
#: The most rows each part takes.
TURN_MAX = 12
RESULT_MAX = 14
RECENT_MAX = 10


class Share(NamedTuple):
    """Rows for each part of the session pane (``calls`` is what is left for the boxes)."""

    calls: int
    result: int
    recent: int
    turn: int


def share(height: int, header: int, busy: bool, result: int, recent: int,
          turn: int) -> Share:
    """Rows for each part, given the pane's content ``height`` and what each part's text
    needs (``result`` 0: none shown; ``busy``: calls run)."""
    left = max(0, height - header)
    calls = min(left, CALLS_MIN if busy else 1)
    left -= calls
    turn_rows = min(turn, TURN_MIN, left)
    left -= turn_rows
    result_rows = min(result, RESULT_MAX, left)
    left -= result_rows
    extra = min(turn, TURN_MAX) - turn_rows
    extra = max(0, min(extra, left))
    turn_rows += extra
    left -= extra
    recent_rows = min(recent, RECENT_MAX, left)
    left -= recent_rows
    return Share(calls + left, result_rows, recent_rows, turn_rows)
