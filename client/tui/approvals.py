"""The approvals bar: the oldest pending request of the watched session, shown whole.

Theory of operation: :class:`ApprovalsBar` is fed the lane view (PROTOCOL.md §3.3) and shows
the oldest request of its ``approvals`` -- ``tool asks: <exact command>`` -- above the
buttons allow once (y) / for session (a) / reject (n); it is hidden when nothing is asked.
A person must see what they approve, so the command is never cut silently: it wraps to the
bar's width, up to ``BAR_LINES`` rows; a longer one shows its first rows and then
"… N more lines: press v to view the whole command", and ``v`` opens :class:`CommandScreen`
with the full text (scrollable). The wrap is made again when the bar's width changes.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from client.tui.ansi import visible_text

__all__ = ["ApprovalsBar", "CommandScreen", "oldest_approval", "BAR_LINES"]

#: The most rows of the command the bar shows (more: "… N more lines", v shows all).
BAR_LINES = 6


def oldest_approval(lane: Any) -> tuple[str, dict[str, Any]] | None:
    """The pending request asked first, of a lane view (``(approvalId, entry)``)."""
    approvals = (lane or {}).get("approvals") or {}
    if not approvals:
        return None
    approval_id = min(approvals, key=lambda a: (approvals[a].get("askedAt") or 0, a))
    return approval_id, approvals[approval_id]


def request_text(entry: dict[str, Any], more: int = 0) -> Text:
    """``tool asks: <command>`` (+N more requests)."""
    text = Text(f"{entry.get('tool', '?')} asks: ", style="bold")
    text.append(visible_text(str(entry.get("summary", ""))))
    if more:
        text.append(f"  (+{more} more)", style="dim")
    return text


class ApprovalsBar(Vertical):
    """The oldest request, wrapped, with allow once / allow for session / reject."""

    DEFAULT_CSS = """
    ApprovalsBar { height: auto; background: $warning 30%; display: none; }
    ApprovalsBar.asking { display: block; }
    ApprovalsBar #approval-text { width: 1fr; height: auto; padding: 0 1; }
    ApprovalsBar #approval-buttons { height: 1; width: 1fr; }
    ApprovalsBar #approval-buttons Button { min-width: 16; height: 1; min-height: 1;
        border: none; border-top: none; border-bottom: none; padding: 0 1;
        margin: 0 1 0 0; }
    """

    def __init__(self) -> None:
        super().__init__(id="approvals")
        self.approval: tuple[str, dict[str, Any]] | None = None
        self.full_text: Text | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="approval-text")
        with Horizontal(id="approval-buttons"):
            yield Button("allow once (y)", id="approve-once", variant="success")
            yield Button("for session (a)", id="approve-session", variant="primary")
            yield Button("reject (n)", id="reject", variant="error")

    def show(self, lane: Any) -> None:
        found = oldest_approval(lane)
        self.approval = None if found is None else (found[0], dict(found[1]))
        self.set_class(self.approval is not None, "asking")
        if self.approval is None:
            self.full_text = None
            return
        more = len((lane or {}).get("approvals") or {}) - 1
        self.full_text = request_text(self.approval[1], more)
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if self.full_text is None:
            return
        width = max(10, (self.size.width or self.app.size.width) - 2)
        lines = self.full_text.wrap(self.app.console, width, overflow="fold")
        shown = Text("\n").join(lines[:BAR_LINES])
        if len(lines) > BAR_LINES:
            shown.append(f"\n… {len(lines) - BAR_LINES} more lines: press v to view the whole "
                         "command", style="bold")
        self.query_one("#approval-text", Static).update(shown)


class CommandScreen(ModalScreen[None]):
    """The whole text of a request (``v`` on the approvals bar); escape, q or v closes."""

    HELP_NAME = "command"
    BINDINGS = [Binding("escape,q,v", "dismiss", "close")]
    DEFAULT_CSS = """
    CommandScreen { align: center middle; }
    CommandScreen VerticalScroll { width: 90%; height: 90%; border: round $warning;
                                   background: $surface; padding: 0 1; }
    """

    def __init__(self, text: Text) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "the whole request (escape closes)"
            yield Static(self.text)
