"""The approvals bar: the oldest pending request of the watched session, shown whole, and
the oldest one of any other session.

Theory of operation: :class:`ApprovalsBar` is fed the lane view (PROTOCOL.md §3.3) and shows
the oldest request of its ``approvals`` -- ``tool asks: <exact command>`` -- above the
buttons ``y allow once`` / ``a for session`` / ``n reject`` / ``v view all`` (each key first,
then its word: they fit 80 columns whole); it is also fed the oldest pending request of the
other sessions (``approval.list``, which the app asks while the list shows one:
``show_elsewhere``) and then shows ``<session> asks: <command>`` with ``j watch it`` -- only
the watched session's requests can be answered here (the TUI answers the session it
subscribes to), so the person is told and taken there with one key. It is hidden when
nothing is asked anywhere.
A person must see what they approve, so the command is never cut silently: it wraps to the
bar's width, up to ``BAR_LINES`` rows; a longer one shows its first rows and then
"… N more lines: press v to view the whole command", and ``v`` opens :class:`CommandScreen`
with the full text (scrollable). The wrap is made again when the bar's width changes.

The decision keys ``y`` / ``a`` / ``n`` (and ``v``) are the bar's own bindings: they act only
while the bar (or one of its buttons) has the focus -- tab, a click, or f6 puts it there --
so a word typed into the sessions list (``make all``) answers nothing; f2 / f3 / f4 stay
app-wide. A request is armed only once it has been shown for ``ARM_S`` (``armed``, as a
browser's security dialog delays its buttons): the next request shows ~100 ms after one is
decided, and a double tap or a key repeat must not approve it unseen. ``shown_at`` is reset
whenever the request shown changes; the app refuses a decision before, with a notice.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from client.tui.ansi import visible_line, visible_text

__all__ = ["ApprovalsBar", "CommandScreen", "oldest_approval", "BAR_LINES", "ARM_S"]

#: The most rows of the command the bar shows (more: "… N more lines", v shows all).
BAR_LINES = 6
#: Seconds a request is shown before a key (or a click) can decide it.
ARM_S = 0.6


def oldest_approval(lane: Any) -> tuple[str, dict[str, Any]] | None:
    """The pending request asked first, of a lane view (``(approvalId, entry)``)."""
    approvals = (lane or {}).get("approvals") or {}
    if not approvals:
        return None
    approval_id = min(approvals, key=lambda a: (approvals[a].get("askedAt") or 0, a))
    return approval_id, approvals[approval_id]


def request_text(entry: dict[str, Any], more: int = 0) -> Text:
    """``tool asks: <command>`` (+N more requests)."""
    text = Text(f"{visible_line(entry.get('tool', '?'))} asks: ", style="bold")
    text.append(visible_text(str(entry.get("summary", ""))))
    if more:
        text.append(f"  (+{more} more)", style="dim")
    return text


class ApprovalsBar(Vertical, can_focus=True):
    """The oldest request, wrapped, with allow once / allow for session / reject."""

    HELP_NAME = "approvals bar"
    BINDINGS = [
        Binding("y", "app.decide('once')", "allow once"),
        Binding("a", "app.decide('session')", "allow for session",
                tooltip="allow for session (an exact rule of the command)"),
        Binding("n", "app.decide('reject')", "reject"),
        Binding("v", "app.view_request", "view the whole request"),
    ]
    EXTRA_KEYS = (("tab, f6, click", "to the bar: y / a / n act only there"),
                  ("y, a, n, f2-f4", f"act once the request has been shown {ARM_S:g} s"))

    DEFAULT_CSS = """
    ApprovalsBar { height: auto; background: $warning 30%; display: none; }
    ApprovalsBar.asking { display: block; }
    ApprovalsBar #approval-text { width: 1fr; height: auto; padding: 0 1; }
    ApprovalsBar #approval-buttons, ApprovalsBar #elsewhere-row { height: 1; width: 1fr; }
    ApprovalsBar.mine-none #approval-text, ApprovalsBar.mine-none #approval-buttons,
    ApprovalsBar.elsewhere-none #elsewhere-row { display: none; }
    ApprovalsBar #approval-buttons Button, ApprovalsBar #elsewhere-row Button { min-width: 0; width: auto; height: 1; min-height: 1;
        border: none; border-top: none; border-bottom: none; padding: 0 1;
        margin: 0 1 0 0; }
    ApprovalsBar #elsewhere-text { width: 1fr; height: 1; padding: 0 1; }
    ApprovalsBar:focus-within { background: $warning 60%; }
    ApprovalsBar .hint { width: 1fr; height: 1; color: $text-muted; }
    ApprovalsBar #hint-focused, ApprovalsBar:focus-within #hint-away { display: none; }
    ApprovalsBar:focus-within #hint-focused { display: block; }
    """

    def __init__(self) -> None:
        super().__init__(id="approvals", classes="mine-none elsewhere-none")
        self.approval: tuple[str, dict[str, Any]] | None = None
        self.full_text: Text | None = None
        #: The oldest request of another session: (session id, label, command), or None.
        self.elsewhere: tuple[str, str, str] | None = None
        #: When the request shown was first shown (``time.monotonic``): ``armed``.
        self.shown_at = 0.0

    def compose(self) -> ComposeResult:
        yield Static(id="approval-text")
        with Horizontal(id="approval-buttons"):
            yield Button("y allow once", id="approve-once", variant="success")
            yield Button("a for session", id="approve-session", variant="primary")
            yield Button("n reject", id="reject", variant="error")
            yield Button("v view all", id="view-request")
            yield Static("tab/f6: answer here", id="hint-away", classes="hint")
            yield Static("keys answer", id="hint-focused", classes="hint")
        with Horizontal(id="elsewhere-row"):
            yield Static(id="elsewhere-text")
            yield Button("j watch it", id="watch-asking", variant="warning")

    def update_shown(self) -> None:
        self.set_class(self.approval is None, "mine-none")
        self.set_class(self.elsewhere is None, "elsewhere-none")
        asking = self.approval is not None or self.elsewhere is not None
        self.set_class(asking, "asking")
        if not asking and self.has_focus_within:
            # Hidden: the focus goes back to the sessions list (f6 comes back for the next).
            back = getattr(self.app, "action_focus_sessions", None)  # DshApp's; else none
            self.app.call_later(back if back is not None else lambda: self.screen.set_focus(None))

    def show_elsewhere(self, found: tuple[str, str, str, int] | None) -> None:
        """``(session id, session label, command, more)`` of the oldest request of another
        session (``more``: how many others wait besides), or None."""
        self.elsewhere = None if found is None else found[:3]
        if found is not None:
            _, label, command, more = found
            text = Text(f"{visible_line(label)} asks: ", style="bold", no_wrap=True,
                        overflow="ellipsis")
            text.append(visible_line(command))
            if more:
                text.append(f"  (+{more} more)", style="dim")
            self.query_one("#elsewhere-text", Static).update(text)
        self.update_shown()

    def show(self, lane: Any) -> None:
        found = oldest_approval(lane)
        before = self.approval[0] if self.approval is not None else None
        self.approval = None if found is None else (found[0], dict(found[1]))
        if found is not None and found[0] != before:
            self.shown_at = time.monotonic()  # a new request under the cursor: not armed
        self.update_shown()
        if self.approval is None:
            self.full_text = None
            return
        more = len((lane or {}).get("approvals") or {}) - 1
        self.full_text = request_text(self.approval[1], more)
        self._draw()

    def armed(self) -> bool:
        """Whether the request shown has been shown for ``ARM_S`` (a key may decide it)."""
        return self.approval is not None and time.monotonic() - self.shown_at >= ARM_S

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
