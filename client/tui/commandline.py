"""``CommandLine``: the TUI's command line, an ``Input`` whose keystrokes repaint that line only.

Theory of operation: Textual's ``Input`` sets its scrollable size (``virtual_size``: the
width of its text) on every change of its value, and ``Widget.virtual_size`` is declared as
needing a layout: each key typed asked for a reflow of the whole screen -- every pane, call
box and table arranged again, 4-7 ms of the key's frame on the 2-core test machine, tens of
ms while a flood's redraws share the loop (``bench/bench_tui_latency.py``, ``tui-*``). The
layout changes nothing: the line's size on screen is fixed by CSS (a docked line of fixed
height at full width), and what the new scrollable width is for -- scrolling the text so
the cursor stays in view -- reads the value just set, not the layout. This class declares
the same reactive as a repaint of the line alone; everything else is Textual's ``Input``.
"""

from __future__ import annotations

from textual.geometry import Size
from textual.reactive import Reactive
from textual.widgets import Input

__all__ = ["CommandLine"]


class CommandLine(Input):
    """The command line (module doc)."""

    virtual_size = Reactive(Size(0, 0), layout=False)
