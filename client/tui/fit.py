"""How the session pane's rows are shared: every row to a part that has something to show.

Theory of operation: the session pane (``client.tui.panes.SessionPane``) stacks its header
(one row, cut with "…"), the running calls' boxes (newest first), the last typed command's
result, the recent results and the turn. :func:`share` is the rule, a pure function of row
counts. First what must show: the newest call's box with ``CALL_BODY_MIN`` output rows (a box
is never shown without an output row: one that does not fit is not shown, and a ``+N more
running`` row counts the calls left out), the turn up to ``TURN_MIN`` rows, the result up to
``RESULT_FIRST``, the recent list up to ``RECENT_FIRST`` (a heading alone is never shown: the
list gets at least its heading and one entry, or nothing), the rest of the turn up to
``TURN_FIRST``, then one more box per running call while one fits (and, when one does not,
the recent list gives up its rows but its heading and newest entry). What is left goes to the
parts that have more to show, in this order: the boxes' output (a row at a time, newest box
first, each up to the lines its call has), then the recent list, the result and the turn, each
up to its whole text. Rows are left blank only when nothing has more to show. A part that gets
fewer rows than its text shows the rows that matter (the boxes and the result the END of
their output, the recent list its newest entries, the turn its header and the end of its
streaming text: ``client.tui.panes``). :func:`result_lines`, :func:`cut` and
:func:`head_line` make those rows: one row each, cut at the edge, never wrapped.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from rich.text import Text

from client.tui.ansi import strip_controls

__all__ = ["Share", "share", "CALL_CHROME", "CALL_BODY_MIN", "CALLS_MIN", "TURN_MIN",
           "TURN_FIRST", "RESULT_FIRST", "RECENT_FIRST", "result_lines", "cut", "head_line"]

#: Rows of a call's box that are not output: its border (2), its command (1), its margin (1).
CALL_CHROME = 4
#: Output rows the newest running call's box keeps before anything else gets a row.
CALL_BODY_MIN = 4
#: The rows the newest running call keeps, whatever else asks.
CALLS_MIN = CALL_CHROME + CALL_BODY_MIN
#: The rows the turn keeps (its border, its header line, the end of its text).
TURN_MIN = 5
#: What each part gets in the first pass (the rest comes from the rows left over).
TURN_FIRST = 12
RESULT_FIRST = 8
RECENT_FIRST = 6

#: The most output lines of a typed result kept to show (its end: the rows given show the
#: last of them), and the most characters of one line parsed (a 5 MB line is cut, not wrapped).
RESULT_LINES = 100
RESULT_LINE_CHARS = 1000


class Share(NamedTuple):
    """Rows for each part of the session pane: ``bodies`` the output rows of each box shown
    (newest first; the others are not shown), ``more`` the ``+N more running`` row (0 or 1)."""

    bodies: tuple[int, ...]
    more: int
    result: int
    recent: int
    turn: int

    @property
    def calls(self) -> int:
        """Rows of the calls' area: the boxes shown and the ``+N more`` row."""
        return sum(CALL_CHROME + body for body in self.bodies) + self.more


def share(height: int, header: int, calls: Sequence[int], result: int, recent: int,
          turn: int) -> Share:
    """Rows for each part, given the pane's content ``height``, the header's rows, the output
    lines each running call has (newest first) and the rows each other part's whole text needs
    (``result`` 0: none shown)."""
    left = max(0, height - header)
    wants = [max(1, lines) for lines in calls]
    bodies: list[int] = []

    def add_box() -> bool:
        nonlocal left
        more = 1 if len(wants) > len(bodies) + 1 else 0  # the "+N more" row, if still needed
        room = left - CALL_CHROME - more
        if len(bodies) >= len(wants) or room < 1:
            return False
        body = min(wants[len(bodies)], CALL_BODY_MIN, room)
        bodies.append(body)
        left -= CALL_CHROME + body
        return True

    add_box()
    left_for_more = 1 if len(wants) > len(bodies) else 0  # kept for the "+N more" row
    left -= left_for_more
    turn_rows = min(turn, TURN_MIN, max(0, left))
    left -= turn_rows
    result_rows = min(result, RESULT_FIRST, max(0, left))
    left -= result_rows
    recent_rows = min(recent, RECENT_FIRST, max(0, left))
    left -= recent_rows
    extra = max(0, min(min(turn, TURN_FIRST) - turn_rows, left))
    turn_rows += extra
    left -= extra
    left += left_for_more
    while add_box():
        pass
    more = 1 if len(wants) > len(bodies) else 0
    left -= more
    while left > 0 and any(body < want for body, want in zip(bodies, wants)):
        for i, want in enumerate(wants[:len(bodies)]):  # a row each, newest first
            if left > 0 and bodies[i] < want:
                bodies[i] += 1
                left -= 1
    for part in ("recent", "result", "turn"):
        if part == "recent":
            got = min(recent - recent_rows, left)
            recent_rows += got
        elif part == "result":
            got = min(result - result_rows, left)
            result_rows += got
        else:
            got = min(turn - turn_rows, left)
            turn_rows += got
        left -= max(0, got)
    if recent_rows < min(recent, 2):  # never a heading alone
        left += recent_rows
        recent_rows = 0
    while len(bodies) < len(wants):  # a hidden call: its box before more recent entries
        more_after = 1 if len(wants) > len(bodies) + 1 else 0
        need = CALL_CHROME + 1 + more_after - more
        spare = recent_rows - 2 if recent_rows > 2 else 0
        if left + spare < need:
            break
        taken = max(0, need - left)
        recent_rows -= taken
        left += taken - need
        bodies.append(1)
        more = more_after
        grow = min(left, wants[len(bodies) - 1] - 1)
        bodies[-1] += grow
        left -= grow
    return Share(tuple(bodies), more, result_rows, recent_rows, turn_rows)


def result_lines(output: str, lines: int = RESULT_LINES,
                 chars: int = RESULT_LINE_CHARS) -> list[Text]:
    """The last ``lines`` lines of a result's output, each as a terminal leaves it (after a
    ``\\r`` only what follows it), cut to ``chars`` before it is parsed and never wrapped."""
    shown = []
    for line in output.rstrip("\n").rsplit("\n", lines)[-lines:]:
        if "\r" in line:
            line = line.rstrip("\r").rsplit("\r", 1)[-1]
        text = Text.from_ansi(strip_controls(line[:chars]), no_wrap=True, end="")
        if "\t" in line:
            text.expand_tabs()
        shown.append(text)
    return shown


def cut(text: Text, width: int) -> Text:
    """``text`` on one row of ``width`` cells: its end cut with "…" (a copy)."""
    text = text.copy()
    text.no_wrap = True
    text.truncate(max(1, width), overflow="ellipsis")
    return text


def head_line(head: Text, width: int) -> Text:
    """A result's ``$ command → status`` on one row: the command cut, the status kept."""
    status = head.plain.rsplit(" → ", 1)[-1]
    if head.cell_len <= width:
        return head
    command = head[:len(head.plain) - len(status) - 3]
    return Text.assemble(cut(command, width - len(status) - 3), " → " + status,
                         style=head.style)
