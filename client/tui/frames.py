"""What keeps a key's redraw within one frame while output floods: Textual's frame cap and
the garbage collector's long-lived objects.

Theory of operation: two delays that are not the TUI's work stood between a keypress and its
frame, measured by ``bench/bench_tui_latency.py`` under a 1 GiB flood:

* **The frame grid.** Textual draws a screen's changes on a timer of ``1 / MAX_FPS``
  (Textual's ``TEXTUAL_FPS`` setting, 60 by default): a change waits for the grid's next
  tick, and when the tick before it drew a flood's redraw, for the one after. A key's frame
  waited up to two frames (13-48 ms) with nothing to do. ``dsh tui`` sets the cap to
  ``MAX_FPS`` (1000: the grid's wait is at most 2 ms -- after a late frame Textual skips to
  the next free tick, one to two ticks away, which at 240 was up to 8.3 ms), unless the
  person set ``TEXTUAL_FPS`` themselves. The cap bounds how often a frame *may* be drawn; how often
  one *is* drawn stays bounded by each view's own rate (``OutputView.REDRAWS_PER_S``, the
  panes' one poll a second): nothing draws more because the cap is higher. Textual reads
  the setting once, when ``textual.constants`` is imported: :func:`set_frame_cap` runs in
  ``client.tui``'s package import, before any of its modules imports Textual, and sets the
  variable only for that import (child processes do not inherit it).
* **Full collections.** CPython's cyclic collector walks every tracked object on a full
  (generation 2) collection. Textual, Rich and the client import about 40,000 of them --
  classes, functions, module dicts, costly to walk -- and a full collection took 30-140 ms
  on the 2-core test machine, several frames, at moments the flood's garbage picks.
  :func:`freeze_long_lived`, once the screen is up, moves every object alive then into the
  permanent generation (``gc.freeze``): later collections walk only what was made since
  (the views' windows, the lane), which is bounded. What was frozen and dies later is not
  reclaimed by the collector (reference counting still frees what has no cycle) until
  :func:`thaw_long_lived` (``gc.unfreeze``) when the app's screen goes, so that a process
  running one app after another (tests, the bench) does not keep each app's objects.
"""

from __future__ import annotations

import gc
import os
import sys

__all__ = ["MAX_FPS", "set_frame_cap", "freeze_long_lived", "thaw_long_lived"]

#: The most frames a second Textual may draw (module doc). After a frame that ran late
#: Textual skips to the grid's next free tick (1-2 ticks away): at 1000 a key's frame waits
#: at most 2 ms for it (8.3 ms at 240).
MAX_FPS = 1000


def set_frame_cap() -> int | None:
    """Have Textual load with ``MAX_FPS`` as its frame cap, unless ``TEXTUAL_FPS`` is set;
    returns the cap Textual loaded with, or None when Textual had loaded before (its own
    value stands then)."""
    if "textual.constants" in sys.modules:
        return None
    ours = "TEXTUAL_FPS" not in os.environ
    if ours:
        os.environ["TEXTUAL_FPS"] = str(MAX_FPS)
    try:
        import textual.constants
    finally:
        if ours:
            del os.environ["TEXTUAL_FPS"]
    return textual.constants.MAX_FPS


def freeze_long_lived() -> None:
    """Collect what is garbage now, then freeze every object alive (module doc)."""
    gc.collect()
    gc.freeze()


def thaw_long_lived() -> None:
    """Give what :func:`freeze_long_lived` froze back to the collector (module doc)."""
    gc.unfreeze()
