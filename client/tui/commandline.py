"""``CommandLine``: the TUI's command line, an ``Input`` whose keystrokes repaint that line only.

Theory of operation: Textual's ``Input`` sets its scrollable size (``virtual_size``: the
width of its text) on every change of its value, and ``Widget.virtual_size`` is declared as
needing a layout: each key typed asked for a reflow of the whole screen -- every pane, call
box and table arranged again, 4-7 ms of the key's frame on the 2-core test machine, tens of
ms while a flood's redraws share the loop (``bench/bench_tui_latency.py``, ``tui-*``). The
layout changes nothing: the line's size on screen is fixed by CSS (a docked line of fixed
height at full width), and what the new scrollable width is for -- scrolling the text so
the cursor stays in view -- reads the value just set, not the layout. This class declares
the same reactive as a repaint of the line alone.

A paste of several lines (a bracketed paste) is kept whole: Textual's ``Input`` keeps only the
first line of a paste and dropped the rest silently. Here each line break shows in the line
as ``NEWLINE_MARK`` (a one-line widget cannot show a line break), a trailing one dropped, and
:func:`command_text` turns every mark back into a newline when the line is run, so the lines
run as one bash command (``bash -c``, one line after the other) or one chat input. Everything
else is Textual's ``Input``.
"""

from __future__ import annotations

from textual import events
from textual.geometry import Size
from textual.reactive import Reactive
from textual.widgets import Input

__all__ = ["CommandLine", "NEWLINE_MARK", "command_text", "pasted_text"]

#: How a line break of a pasted text shows in the command line (module doc).
NEWLINE_MARK = "\u23ce"


def pasted_text(text: str) -> str:
    """A paste as the line shows it: its lines joined by ``NEWLINE_MARK`` (no trailing one)."""
    return NEWLINE_MARK.join(text.splitlines())


def command_text(value: str) -> str:
    """What the line runs: every ``NEWLINE_MARK`` a newline again."""
    return value.replace(NEWLINE_MARK, "\n")


class CommandLine(Input):
    """The command line (module doc)."""

    virtual_size = Reactive(Size(0, 0), layout=False)

    def _on_paste(self, event: events.Paste) -> None:
        # Textual runs every class's handler along the MRO: one line is Input's to insert.
        if not event.text or len(event.text.splitlines()) <= 1:
            return
        event.prevent_default()  # not Input's: it keeps the first line only
        text = pasted_text(event.text)
        selection = self.selection
        if selection.is_empty:
            self.insert_text_at_cursor(text)
        else:
            self.replace(text, *selection)
        event.stop()
