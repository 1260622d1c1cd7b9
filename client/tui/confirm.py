"""``ConfirmScreen``: a one-line question that only ``y`` answers yes.

Theory of operation: a small modal over the main screen (e.g. "cancel call c-… ($ make)?");
``y`` dismisses it with True, any other key (or a click outside) with False. It consumes
every key, so no binding below it acts on the key that answered it. ``y`` is armed only once
the question has been shown for ``ARM_S`` (the approvals bar's delay): a ``y`` before that
does nothing but a notice, so the letters typed after a ``c`` in an ordinary word
(``cycle``: ``c``, ``y``) never confirm; any other key says no at once.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.screen import ModalScreen
from textual.widgets import Static

from client.tui.ansi import visible_line
from client.tui.approvals import ARM_S

__all__ = ["ConfirmScreen"]


class ConfirmScreen(ModalScreen[bool]):
    """``question`` (y: yes; any other key: no)."""

    HELP_NAME = "confirm"
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen Static { width: 80%; height: auto; border: round $error; padding: 0 1;
                           background: $surface; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question
        self.shown_at = time.monotonic()

    def on_mount(self) -> None:
        self.shown_at = time.monotonic()

    def compose(self) -> ComposeResult:
        yield Static(Text(f"{visible_line(self.question)}\ny: yes · any other key: no"),
                     id="question")

    def on_key(self, event: events.Key) -> None:
        event.stop()
        event.prevent_default()
        if event.key == "y" and time.monotonic() - self.shown_at < ARM_S:
            self.notify("read the question, then answer (y: yes)", severity="warning")
            return
        self.dismiss(event.key == "y")

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.dismiss(False)
