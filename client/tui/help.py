"""The help screen: every key of the TUI, generated from the bindings so it cannot drift.

Theory of operation: :func:`key_rows` walks the ``BINDINGS`` of the classes it is given (the
app, the attach screen's keys, this screen) and returns one ``(where, keys, what)`` row per
action (the keys of all its bindings: the priority ``ctrl+k`` and the letter ``c``), with the
key names as Textual displays them and what it does (the first binding's ``tooltip``, the
long form, else the footer's short ``description``); keys that are not bindings (the attach
screen's two-key detach, the command line's prefix) are declared as ``EXTRA_KEYS`` next to
the code that handles them and listed too. :class:`HelpScreen` shows the rows in a ``rich`` table whose
"what" column wraps to the width there is (at 80 columns a description takes two lines, never
cut), in a scroller (Page Down, the mouse wheel) when the rows are taller than the screen.
"""

from __future__ import annotations

from typing import Iterable

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

__all__ = ["HelpScreen", "key_rows"]

#: Key names Textual spells out, as a person reads them.
_SHOWN = {"question_mark": "?", "colon": ":", "slash": "/"}


def key_rows(owners: Iterable[type]) -> list[tuple[str, str, str]]:
    """``(where, keys, what)`` for every binding of ``owners`` and their ``EXTRA_KEYS``."""
    rows: list[tuple[str, str, str]] = []
    for owner in owners:
        where = getattr(owner, "HELP_NAME", owner.__name__)
        by_action: dict[str, int] = {}
        for binding in getattr(owner, "BINDINGS", []):
            if isinstance(binding, Binding):
                keys, action = binding.key, binding.action
                what = binding.tooltip or binding.description or binding.action
            else:
                keys, action = binding[0], binding[1]
                what = binding[2] if len(binding) > 2 else binding[1]
            names = ", ".join(_SHOWN.get(k.strip(), k.strip()) for k in keys.split(","))
            if action in by_action:  # one action bound twice (a priority key and a letter)
                at = by_action[action]
                rows[at] = (where, f"{rows[at][1]}, {names}", rows[at][2])
                continue
            by_action[action] = len(rows)
            rows.append((where, names, what))
        for keys, what in getattr(owner, "EXTRA_KEYS", ()):
            rows.append((where, keys, what))
    return rows


class HelpScreen(ModalScreen[None]):
    """Every key; escape, q or ? closes it."""

    HELP_NAME = "help"
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close the help")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 116; max-width: 100%; height: auto; max-height: 100%;
                            border: round $accent; background: $surface; padding: 0 1; }
    HelpScreen VerticalScroll { height: auto; max-height: 40; }
    """

    def __init__(self, owners: Iterable[type]) -> None:
        super().__init__()
        self.rows = key_rows([*owners, HelpScreen])

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("dsh tui: keys (mouse: click a session, a button, the command line)")
            with VerticalScroll(id="keys"):
                yield Static(self._table())

    def _table(self) -> Table:
        table = Table(expand=True, box=None,
                      header_style="bold", pad_edge=False)
        table.add_column("where", no_wrap=True)
        table.add_column("keys", no_wrap=True)
        table.add_column("what", ratio=1, overflow="fold")
        for row in self.rows:
            table.add_row(*row)
        return table

    def on_mount(self) -> None:
        self._fit()
        self.query_one("#keys", VerticalScroll).focus()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        """The rows scroll within the screen: its height less the border and the title."""
        self.query_one("#keys", VerticalScroll).styles.max_height = max(3, self.size.height - 3)

    def text(self) -> str:
        """All rows as plain lines (tests, screen readers)."""
        return "\n".join("  ".join(row) for row in self.rows)
