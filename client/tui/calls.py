"""How the TUI shows one running call: a header, and its output live (raw) or the lane's tail.

Theory of operation: a :class:`CallView` is a bordered box titled ``callId · tool · state``
with the call's command and a body of ``TAIL_LINES`` rows (fewer when the session pane has
fewer to give: ``set_body_rows``). When the app is connected and the
call is one of the ``LIVE_VIEWS`` newest running calls of the session, the body is the tuiterm
room's ``client.tui.outputview.OutputView``: the call's raw output followed with
``tool.follow`` in a bounded window, ANSI colours, scroll-back by ``tool.read``, resumed on a
new connection (``resume``). Any other call -- beyond
``LIVE_VIEWS`` (a session with 100 calls opens 6 follows, not 100), or with dshd away -- shows
the last ``TAIL_LINES`` lines of the lane's own bounded output window (PROTOCOL.md §3.3,
``ToolOutput``) as rich text: what the lane already carries, never a history. The box keeps
only strings of the lane's entry (the lane is the mirror's live value, changed in place).
A box takes the focus (tab, click): the focused box is the selected call, which ``c`` cancels,
and its scroll keys (up/down, Page Up/Down, Home, End: ``BINDINGS``) act on its live view --
the view itself is left out of the focus chain (one Tab stop a box), so the keys reach it only
through the box; a box without a live view lets them through to the pane (``SkipAction``).
"""

from __future__ import annotations

from typing import Any, Callable

from rich.console import Group
from rich.text import Text
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.widgets import Static

from client.tui.ansi import label, strip_controls, visible_line
from client.tui.outputview import OutputView

__all__ = ["CallView", "TAIL_LINES", "LIVE_VIEWS", "call_command", "output_text", "is_tty"]

#: Rows of a running call's output shown in the session pane.
TAIL_LINES = 12
#: Running calls of the watched session whose raw output is followed live (the newest).
LIVE_VIEWS = 6


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


class CallView(Vertical, can_focus=True):
    """One running call (module doc). ``client``: the app's current client (None: none)."""

    DEFAULT_CSS = f"""
    CallView {{ border: round $primary; padding: 0 1; height: auto; margin-bottom: 1; }}
    CallView:focus-within {{ border: double $accent; }}
    CallView .call-command {{ height: 1; text-style: bold; text-wrap: nowrap;
                             text-overflow: ellipsis; }}
    CallView .call-tail {{ height: auto; }}
    CallView OutputView {{ height: {TAIL_LINES}; }}
    """
    #: The focused box's keys scroll its output (``OutputView``'s actions, module doc). Not
    #: in the help screen: one more row there takes the help at 80x24 past one page.
    BINDINGS = [
        Binding("up", "scroll_output('line_up')", "output: a line up", show=False),
        Binding("down", "scroll_output('line_down')", "output: a line down", show=False),
        Binding("pageup", "scroll_output('page_up_older')", "output: a page up", show=False),
        Binding("pagedown", "scroll_output('page_down')", "output: a page down", show=False),
        Binding("home", "scroll_output('home_older')", "output: its top", show=False),
        Binding("end", "scroll_output('tail')", "output: follow its end", show=False),
    ]

    def __init__(self, session_id: str, call_id: str, entry: dict[str, Any], *,
                 client: Callable[[], Any] | None = None) -> None:
        super().__init__(id=f"call-{call_id}", classes="call")
        self.session_id = session_id
        self.call_id = call_id
        self.entry: dict[str, Any] = {}
        self._shown: tuple[Any, ...] | None = None
        self._client = client
        self.live: OutputView | None = None
        if client is not None and client() is not None:
            self.live = OutputView(client, session_id, call_id)
            self.live.can_focus = False  # the box takes the focus and hands it the keys
        self._entry_at_start = entry
        self._ready = False
        #: Output rows shown (``TAIL_LINES`` unless the session pane has fewer to give).
        self.body_rows = TAIL_LINES

    def action_scroll_output(self, action: str) -> None:
        """A scroll key of the focused box: its live view's action (none: the pane's)."""
        if self.live is None:
            raise SkipAction()
        getattr(self.live, f"action_{action}")()

    def compose(self) -> ComposeResult:
        yield Static(classes="call-command")
        yield self.live if self.live is not None else Static(classes="call-tail")

    def on_mount(self) -> None:
        self._ready = True
        self.update_entry(self.entry or self._entry_at_start)

    def update_entry(self, entry: dict[str, Any]) -> None:
        """Show ``entry`` (the lane's live value: only its strings are kept to compare)."""
        self.entry = entry
        # A live view draws the output itself: the lane's window (which every batch of a
        # busy call changes) is not compared then, and the header is drawn again only when
        # it changed -- without a layout (its row's height is fixed), as a layout of the
        # whole screen per batch is what a key typed meanwhile would wait for.
        shown = (entry.get("state"), call_command(entry), is_tty(entry),
                 output_text(entry) if self.live is None else None)
        if shown == self._shown or not self._ready:
            return
        try:
            command_row = self.query_one(".call-command", Static)
        except NoMatches:
            return  # removed (the call settled) before its rows were mounted
        before, self._shown = self._shown, shown
        if before is None or before[:3] != shown[:3]:
            tty = " · pty: ^o" if shown[2] else ""  # short: the whole title fits at 80
            self.border_title = (f"{label(self.call_id)} · {label(entry.get('name', '?'))} · "
                                 f"{label(shown[0])}{tty}")
            # One row, cut at its last cell with an ellipsis (not at a word wrap).
            command_row.update(Text("$ " + visible_line(shown[1]), no_wrap=True,
                                    overflow="ellipsis"), layout=False)
        if self.live is None and (before is None or before[3] != shown[3]):
            body = (Text.from_ansi(strip_controls(tail(shown[3], self.body_rows))) if shown[3]
                    else Text("(no output yet)", style="dim"))
            self.query_one(".call-tail", Static).update(Group(body))

    def set_body_rows(self, rows: int) -> None:
        """Show ``rows`` lines of output (the session pane shares its rows: ``fit``)."""
        if rows == self.body_rows:
            return
        self.body_rows = rows
        if self.live is not None:
            self.live.styles.height = rows
        else:
            self._shown = None
            self.update_entry(self.entry or self._entry_at_start)

    def resume(self, client: Any) -> None:
        """A new connection: the live view follows again from the next byte it lacks."""
        if self.live is not None:
            self.live.resume(client)

    @property
    def output_lines(self) -> int:
        """How many lines of output this box has to show (what it would fill)."""
        if self.live is not None:
            return len(self.live.window)
        text = output_text(self.entry or self._entry_at_start)
        return text.rstrip("\n").count("\n") + 1 if text else 1

    @property
    def shown_output(self) -> str:
        """The output lines shown: the live view's rows, else the lane window's tail."""
        if self.live is not None:
            window = self.live.window
            count = len(window)
            return "\n".join(window.text(i) for i in range(max(0, count - TAIL_LINES), count))
        return tail(output_text(self.entry))

    @property
    def plain(self) -> str:
        """The command and the output shown (tests, screen readers)."""
        return call_command(self.entry) + "\n" + self.shown_output
