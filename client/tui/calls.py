"""How the TUI shows one running call: its header and the tail of the lane's output window.

Theory of operation: the lane view already carries each running call's output as a bounded
window (PROTOCOL.md §3.3, ``ToolOutput``: the retained text, cut by bytes and lines), so a
:class:`CallView` renders only the last ``TAIL_LINES`` lines of that window, with its ANSI
colours (``rich.text.Text.from_ansi``), never the call's history. It is the stand-in until the
tuiterm room's ``client.tui.outputview.OutputView`` (raw output with scroll-back through
``tool.read``) is merged; the session pane is the only place that builds one.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

__all__ = ["CallView", "TAIL_LINES", "call_command", "output_text", "is_tty"]

#: Lines of a running call's output shown in the session pane.
TAIL_LINES = 12


def call_command(entry: dict[str, Any]) -> str:
    """The command of a lane ``tools`` entry (its args may be cut to a JSON string)."""
    args = entry.get("args")
    if isinstance(args, dict):
        return str(args.get("command", ""))
    return str(args or "")


def is_tty(entry: dict[str, Any]) -> bool:
    """Whether the call runs under a PTY (its args ask for one)."""
    args = entry.get("args")
    return isinstance(args, dict) and bool(args.get("tty"))


def output_text(entry: dict[str, Any]) -> str:
    """The retained output window of a lane ``tools`` entry."""
    output = entry.get("output") or {}
    parts = [c.get("text", "") for c in output.get("content") or [] if isinstance(c, dict)]
    return "".join(parts)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text`` (cost: the tail, not the whole window)."""
    return "\n".join(text.rstrip("\n").rsplit("\n", lines)[-lines:])


class CallView(Static):
    """One running call: ``callId  state  $ command`` and the tail of its output."""

    DEFAULT_CSS = """
    CallView { border: round $primary; padding: 0 1; height: auto; margin-bottom: 1; }
    """

    def __init__(self, call_id: str, entry: dict[str, Any]) -> None:
        super().__init__(id=f"call-{call_id}", classes="call")
        self.call_id = call_id
        self.entry: dict[str, Any] = {}
        self._shown: tuple[Any, ...] | None = None
        self.update_entry(entry)

    def update_entry(self, entry: dict[str, Any]) -> None:
        """Show ``entry`` (the lane's live value: only its strings are kept to compare)."""
        self.entry = entry
        shown = (entry.get("state"), call_command(entry), is_tty(entry), output_text(entry))
        if shown == self._shown:
            return
        self._shown = shown
        state = entry.get("state", "?")
        tty = " [pty: t attaches]" if is_tty(entry) else ""
        self.border_title = f"{self.call_id} · {entry.get('name', '?')} · {state}{tty}"
        header = Text("$ ", style="bold") + Text(call_command(entry), style="bold")
        body = Text.from_ansi(tail(shown[3])) if shown[3] else Text("(no output yet)",
                                                                    style="dim")
        self.update(Group(header, body))

    @property
    def shown_output(self) -> str:
        """The output lines shown (without ANSI codes' effect: the raw window's tail)."""
        return tail(output_text(self.entry))

    @property
    def plain(self) -> str:
        """The text shown (for tests and the help of screen readers)."""
        return call_command(self.entry) + "\n" + tail(output_text(self.entry))
