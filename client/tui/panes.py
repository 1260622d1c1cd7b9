"""The TUI's panes: the sessions list, the watched session, the approvals bar, the banner.

Theory of operation: each pane is fed a plain value and renders it; none of them talks to
dshd. :class:`SessionsPane` takes the ``session.list`` answer (``SessionInfo`` structs), labels
each session as the web page does (name, else title, else id: ``session_label``; a label two
sessions share gets its cwd's last part, else its id; a compact status: ``▶N`` running, ``!N``
asking, the last exit; 40 cells wide at most, 60 on a terminal of ``WIDE_AT`` columns) and
keeps its cursor on the same session across updates (rows keyed by session id, newest first
by creation, so rows do not jump); a poll updates only the cells that changed, and the other
panes update a text only when it changed (``update_static``: ``Static.update`` lays out the
whole screen, and a key's frame would wait behind it).
:class:`SessionPane` takes one lane view (PROTOCOL.md §3.3) and shows the session's header,
one ``client.tui.calls.CallView`` per running call (mounted and removed as calls come and
go; the ``LIVE_VIEWS`` newest follow their raw output live, the others show the tail of the
lane's bounded window), the recent results (status word first, then the command: kept from
the ``tools`` entry while the call ran, else read from the log's ``tool/call`` in a worker,
bounded by ``COMMANDS_KEPT``), the result of the last command typed on the command line (its
output, however fast it ended) and the turn's streaming text (an ended turn's whole last text
read back from the log: ``client.tui.turnlog``); its rows are shared by priority
(``client.tui.fit``: the running calls' output first, newest box first, ``+N more running``
for the boxes that do not fit; a one-row header) on each batch, resize and live box's change
of line count (``OutputView.Grew``). :class:`ApprovalsBar` (``client.tui.approvals``,
re-exported here) shows the oldest pending request of the lane's ``approvals``, whole, and is
hidden when there is none; its buttons (mouse) do what its keys do.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Callable

from msgspec import UNSET
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from rich.markup import escape

from client.tui.ansi import label, visible_line
from client.tui.approvals import ApprovalsBar, oldest_approval
from client.tui.calls import LIVE_VIEWS, CallView, call_command
from client.tui.fit import cut, head_line, result_lines, share
from client.tui.outputview import OutputView
from client.tui.sessiontext import (RECENT_SHOWN, exit_word, recent_text, status_word,
                                    turn_text)
from client.tui.turnlog import call_commands, final_text
from client.transport import ConnectionLost, DshClientError
from protocol.rpc import RpcError
from protocol.methods import SessionInfo

__all__ = ["SessionsPane", "SessionPane", "ApprovalsBar", "session_row", "session_label",
           "oldest_approval",
           "RECENT_SHOWN", "status_word", "update_static"]

#: Commands of calls remembered (seen running, or read from the log) for the recent list.
COMMANDS_KEPT = 512
#: Sessions whose last typed command's result is kept (each shows only in its own session).
RESULTS_KEPT = 64
#: The sessions pane's columns: the counts before the cwd, so a long path never hides them.
COLUMNS = ("name", "status", "cwd")
#: The widest cwd shown (cells): longer ones keep their end, after "…".
CWD_CELLS = 32
#: The widest title shown as an unnamed session's label (cells): longer ones end in "…".
LABEL_CELLS = 24


def _v(value: Any, default: Any = None) -> Any:
    return default if value is UNSET or value is None else value


def short_path(path: str, cells: int = CWD_CELLS) -> str:
    """``path`` with the home directory as ``~``, cut from the left to ``cells``."""
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + "/")):
        path = "~" + path[len(home):]
    return path if len(path) <= cells else "…" + path[-(cells - 1):]


def session_label(name: Any, title: Any, session_id: str) -> str:
    """What names a session for a person, as the web page does (``sessions.js``): its name,
    else its title (``dsh run`` titles a new session by its command; one line, controls
    stripped, cut to ``LABEL_CELLS``), else its id."""
    name, title = _v(name), _v(title)
    if isinstance(name, str) and name:
        return visible_line(name)
    if isinstance(title, str) and title.strip():
        # In quotes: an unnamed session titled ``prod`` must not read as the session named
        # ``prod`` (a name has no quotes: protocol.names).
        line = visible_line(" ".join(title.split()))
        line = line if len(line) <= LABEL_CELLS - 2 else line[:LABEL_CELLS - 3] + "…"
        return f'"{line}"'
    return visible_line(session_id)


def session_row(info: SessionInfo) -> tuple[str, ...]:
    """The cells of one session: name (else title, else id), a compact status (``▶N``
    running calls, ``!N`` pending approvals, the last exit), cwd."""
    if info.damaged is not UNSET:
        return (label(info.session_id), "damaged", label(f"damaged: {info.damaged}"))
    if info.unreadable is not UNSET:  # dshd could not look at it now (out of fds)
        return (label(info.session_id), "unreadable", label(f"unreadable: {info.unreadable}"))
    running = _v(info.running, 0)
    pending = _v(info.pending_approvals, 0)
    status = " ".join(part for part in (f"▶{running}" if running else "",
                                        f"!{pending}" if pending else "",
                                        label(exit_word(_v(info.last_exit, "")))) if part)
    return (escape(session_label(info.name, info.title, info.session_id)), status,
            escape(short_path(visible_line(_v(info.cwd, "")))))


def session_rows(sessions: list[SessionInfo]) -> list[tuple[str, ...]]:
    """The rows of ``sessions``: a label two sessions share (20 sessions titled ``true``)
    gets its cwd's last part, else its id, so each row names one session."""
    rows = [session_row(info) for info in sessions]
    seen: dict[str, int] = {}
    for row in rows:
        seen[row[0]] = seen.get(row[0], 0) + 1
    told = []
    for info, row in zip(sessions, rows):
        label = row[0]
        if seen[label] > 1:
            where = os.path.basename(_v(info.cwd, "").rstrip("/")) or info.session_id
            label = f"{label} · {escape(visible_line(where))}"
        told.append((label, *row[1:]))
    again: dict[str, int] = {}
    for row in told:
        again[row[0]] = again.get(row[0], 0) + 1
    return [(f"{first[0]} · {info.session_id}", *row[1:]) if again[row[0]] > 1 else row
            for info, first, row in zip(sessions, rows, told)]


class SessionsPane(DataTable):
    """Every session, newest first; the cursor row is the watched session."""

    DEFAULT_CSS = """
    SessionsPane { width: 2fr; max-width: 40; height: 1fr; min-width: 30; border: round $accent; }
    """
    #: The pane's widest (cells) on a terminal of at least ``WIDE_AT`` columns: the cwd shows.
    WIDE_AT, WIDE_MAX = 160, 60

    def on_resize(self) -> None:
        wide = self.app.size.width >= self.WIDE_AT
        if (self.styles.max_width is not None
                and self.styles.max_width.value != (self.WIDE_MAX if wide else 40)):
            self.styles.max_width = self.WIDE_MAX if wide else 40

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.border_title = "sessions"
        for column in COLUMNS:
            self.add_column(column, key=column)

    def show(self, sessions: list[SessionInfo]) -> None:
        # Newest first by creation: rows keep their places while sessions are busy.
        ordered = sorted(sessions, key=lambda s: (_v(s.created_at, 0), s.session_id),
                         reverse=True)
        wanted = [s.session_id for s in ordered]
        current = self.selected_id()
        rows = session_rows(ordered)
        if wanted != [str(k.value) for k in self.rows]:
            self.clear()
            for info, row in zip(ordered, rows):
                self.add_row(*row, key=info.session_id)
        else:
            for info, row in zip(ordered, rows):  # only changed cells: a same poll repaints nothing
                for column, cell in zip(COLUMNS, row):
                    if self.get_cell(info.session_id, column) != cell:
                        # update_width: a cell wider than its column widens it (not cut)
                        self.update_cell(info.session_id, column, cell, update_width=True)
        if current in wanted and self.cursor_row != wanted.index(current):
            self.move_cursor(row=wanted.index(current))

    def selected_id(self) -> str | None:
        if not self.row_count:
            return None
        try:
            key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:  # noqa: BLE001 - no cell under the cursor (empty table)
            return None
        return None if key.value is None else str(key.value)

    def select(self, session_id: str) -> bool:
        try:
            self.move_cursor(row=self.get_row_index(session_id))
        except Exception:  # noqa: BLE001 - not listed (yet)
            return False
        return True


def update_static(static: Static, content: Any, *, layout: bool = True) -> bool:
    """``static.update(content)`` unless it shows that already (a str or a rich ``Text``
    compares by value): a lane batch that changes nothing repaints, and lays out, nothing
    (``Static.update`` lays out the whole screen). ``layout=False`` for a row whose height
    does not depend on its text (a repaint only). True when it was updated."""
    if type(static.content) is type(content) and static.content == content:
        return False
    static.update(content, layout=layout)
    return True


class SessionPane(Vertical):
    """The watched session: header, running calls, recent results, the turn."""

    DEFAULT_CSS = """
    SessionPane { width: 3fr; border: round $primary; }
    SessionPane #session-header { height: 1; }
    SessionPane #calls { height: 1fr; }
    SessionPane #more-calls { height: 1; color: $text-muted; display: none; }
    SessionPane #recent { height: auto; max-height: 10; color: $text-muted; }
    SessionPane #last-result { height: auto; max-height: 14; display: none; }
    SessionPane #last-result.shown { display: block; border-top: solid $primary; }
    SessionPane #turn { height: auto; max-height: 12; border-top: solid $accent; }
    """

    def __init__(self, client: Callable[[], Any] | None = None) -> None:
        """``client``: the app's current client (None when unconnected): live output views."""
        super().__init__(id="session")
        self.client = client
        self.lane: Any = None
        #: The last turn seen (session id, turn): its text stays shown after it ends.
        self.last_turn: tuple[str, dict[str, Any]] | None = None
        self._commands: OrderedDict[str, str] = OrderedDict()  # callId -> command (bounded)
        self._asked: set[str] = set()  # callIds whose command was asked of the log
        self._title: str | None = None
        #: What the rows are shared by (``client.tui.fit``): the texts as made, before a cut.
        self._header = Text()
        self._turn_full = Text()
        #: The last typed command's result of each session (its header line, its last
        #: output lines): only the watched session's shows.
        self._results: OrderedDict[str, tuple[Text, list[Text]]] = OrderedDict()
        self._result: tuple[Text, list[Text]] | None = None
        self._fitted: dict[str, Any] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="session-header")
        yield VerticalScroll(Static("no session selected", id="no-calls"),
                             Static(id="more-calls"), id="calls")
        yield Static(id="last-result")
        yield Static(id="recent")
        yield Static(id="turn")

    def show(self, lane: Any) -> None:
        self.lane = lane
        session = (lane or {}).get("session") or {}
        session_id = session.get("sessionId")
        title = (session_label(session.get("name"), session.get("title"), str(session_id))
                 if session_id else "session")
        if title != self._title:  # setting it repaints the pane, same value or not
            self._title = title
            self.border_title = escape(title)
        self._header = Text(
            visible_line(f"{session_id or ''}  {session.get('cwd', '')}  policy "
                         f"{session.get('approvalPolicy', '?')}  sandbox "
                         f"{session.get('sandbox', '?')}"),
            style="dim", no_wrap=True, overflow="ellipsis")  # one row, cut with "…" by fit()
        self._show_calls(session.get("sessionId"), (lane or {}).get("tools") or {})
        recent = (lane or {}).get("recent") or []
        self._remember_commands((lane or {}).get("tools") or {})
        self._read_commands(session.get("sessionId"), recent)
        update_static(self.query_one("#recent", Static), recent_text(recent, self._commands))
        self._turn_full = self._turn(session.get("sessionId"), lane)
        self._result = self._results.get(str(session_id)) if session_id else None
        self.query_one("#last-result", Static).set_class(self._result is not None, "shown")
        self.fit()

    def on_resize(self) -> None:
        self.fit()

    def on_output_view_grew(self, event: OutputView.Grew) -> None:
        event.stop()
        self.fit()

    def _rows(self, text: Text | None) -> list[Text]:
        if text is None:
            return []
        return list(text.wrap(self.app.console, max(1, self.size.width), overflow="fold"))

    def _set(self, widget: Any, key: str, value: Any) -> None:
        """Set a style only when it changes (a same value set again would lay out again)."""
        if self._fitted.get(key) != value:
            self._fitted[key] = value
            setattr(widget.styles, key.split(":")[0], value)

    def fit(self) -> None:
        """Share the rows (``client.tui.fit.share``): the running calls' output and the turn
        first, then the last result, then the recent list (which shrinks first)."""
        height = self.size.height
        header = self.query_one("#session-header", Static)  # one row (CSS): a repaint
        if height <= 0:
            update_static(header, self._header, layout=False)
            update_static(self.query_one("#turn", Static), self._turn_full)
            return
        update_static(header, cut(self._header, self.size.width), layout=False)
        views = self._views()
        result_box = self.query_one("#last-result", Static)
        result = 2 + len(self._result[1]) if self._result is not None else 0
        recent_box = self.query_one("#recent", Static)
        recent = 1 + min(RECENT_SHOWN, len((self.lane or {}).get("recent") or []))
        turn_lines = self._rows(self._turn_full)
        got = share(height, 1, [view.output_lines for view in views], result, recent,
                    len(turn_lines) + 1)
        self._set(result_box, "max_height:result", got.result)
        if self._result is not None:  # its header and the END of its output, never wrapped
            head, lines = self._result
            lines = lines[len(lines) - max(0, got.result - 2):] if got.result > 2 else []
            update_static(result_box, Text("\n").join(
                [head_line(head, self.size.width)]
                + [cut(line, self.size.width) for line in lines]))
        self._set(recent_box, "max_height:recent", got.recent)
        self._set(recent_box, "display:recent", "block" if got.recent else "none")
        keep = max(1, got.turn - 1)  # less its border
        if len(turn_lines) > keep:  # its header and the end of its streaming text
            turn_lines = turn_lines[:1] + turn_lines[len(turn_lines) - keep + 1:]
            update_static(self.query_one("#turn", Static), Text("\n").join(turn_lines))
        else:
            update_static(self.query_one("#turn", Static), self._turn_full)
        self._set(self.query_one("#turn", Static), "max_height:turn", got.turn)
        for i, view in enumerate(views):  # newest first; a box with no row is not shown
            if i < len(got.bodies):
                view.set_body_rows(got.bodies[i])
            if view.display != (i < len(got.bodies)):
                view.display = i < len(got.bodies)
        more = self.query_one("#more-calls", Static)
        hidden = len(views) - len(got.bodies)
        update_static(more, f"+{hidden} more running" if hidden else "")
        if more.display != bool(hidden):
            more.display = bool(hidden)

    def _views(self) -> list[CallView]:
        """The running calls' boxes, newest first."""
        return sorted(self.query(CallView),
                      key=lambda v: ((v.entry or v._entry_at_start).get("startedAt") or 0,
                                     v.call_id), reverse=True)

    def _remember_commands(self, tools: dict[str, dict[str, Any]]) -> None:
        """The lane's ``recent`` has no args: keep the command of each call seen running."""
        for call_id, entry in tools.items():
            if call_id not in self._commands:
                self._commands[call_id] = call_command(entry)
        while len(self._commands) > COMMANDS_KEPT:
            self._commands.popitem(last=False)

    def _read_commands(self, session_id: str | None, recent: list[dict[str, Any]]) -> None:
        """Read from the log the commands of recent calls never seen running (once each)."""
        client = self.client() if self.client is not None else None
        missing = {str(e.get("callId")) for e in recent[:RECENT_SHOWN]
                   if e.get("callId") and e.get("callId") not in self._commands
                   and e.get("callId") not in self._asked}
        if client is None or session_id is None or not missing:
            return
        self._asked.update(missing)
        if len(self._asked) > COMMANDS_KEPT:
            self._asked = set(missing)

        async def read() -> None:
            try:
                found = await call_commands(client, session_id, missing)
            except (ConnectionLost, RpcError, DshClientError):
                self._asked.difference_update(missing)  # asked again on the next batch
                return
            self._commands.update(found)
            if (self.lane or {}).get("session", {}).get("sessionId") == session_id:
                self.query_one("#recent", Static).update(
                    recent_text(self.lane.get("recent") or [], self._commands))

        self.run_worker(read(), group="recent-commands", exit_on_error=False)

    def _turn(self, session_id: str | None, lane: Any) -> Text:
        turn = (lane or {}).get("turn")
        if turn:
            calls = [dict(c) for c in turn.get("calls") or []]
            self.last_turn = (str(session_id), {**turn, "calls": calls})
            return turn_text(turn)
        if self.last_turn is not None and self.last_turn[0] == session_id:
            self._read_final_text()
            return turn_text({**self.last_turn[1], "state": "ended"})
        return turn_text(None)

    def _read_final_text(self) -> None:
        """The lane dropped the ended turn with its last step's text: read it from the log
        (once per turn, in a worker)."""
        session_id, turn = self.last_turn
        client = self.client() if self.client is not None else None
        if client is None or turn.get("finalRead"):
            return
        turn["finalRead"] = True

        async def read() -> None:
            try:
                text = await final_text(client, session_id, str(turn.get("turnId")))
            except (ConnectionLost, RpcError, DshClientError):
                return
            if text is not None and self.last_turn is not None and self.last_turn[1] is turn:
                turn["text"] = text
                self.query_one("#turn", Static).update(turn_text({**turn, "state": "ended"}))

        self.run_worker(read(), group="final-text", exit_on_error=False)

    def _show_calls(self, session_id: str | None, tools: dict[str, dict[str, Any]]) -> None:
        box = self.query_one("#calls", VerticalScroll)
        views = {v.call_id: v for v in box.query(CallView)}
        for call_id, view in list(views.items()):
            if call_id not in tools or view.session_id != session_id:
                view.remove()
                del views[call_id]
        order = sorted(tools, key=lambda c: (tools[c].get("startedAt") or 0, c))
        live = set(order[-LIVE_VIEWS:])
        for call_id in order:
            if call_id in views:
                views[call_id].update_entry(tools[call_id])
            else:
                box.mount(CallView(str(session_id), call_id, tools[call_id],  # newest first
                                   client=self.client if call_id in live else None), before=0)
        no_calls = self.query_one("#no-calls", Static)
        no_calls.display = not tools
        update_static(no_calls, "no running calls")

    def show_result(self, session_id: str, command: str, result: Any,
                    raw: str | None = None) -> None:
        """The result of a command typed on the command line: ``$ command → exit N`` and the
        last lines of its output (``raw``: the end of its raw bytes, ``\\r`` kept; else the
        result's output window; it may have ended before any batch showed it).
        Kept per session (the last ``RESULTS_KEPT`` sessions): it shows while its session
        is watched, and only then."""
        status = result.error_code or f"exit {result.exit_code}"
        head = Text.assemble(Text(f"$ {visible_line(' '.join(command.split()))}", no_wrap=True),
                             f" → {visible_line(status)}",
                             style="bold red" if result.is_error else "bold")
        self._results[session_id] = (head, result_lines(
            raw if raw else result.content or result.message or ""))
        self._results.move_to_end(session_id)
        while len(self._results) > RESULTS_KEPT:
            self._results.popitem(last=False)
        if ((self.lane or {}).get("session") or {}).get("sessionId") == session_id:
            self._result = self._results[session_id]
            self.query_one("#last-result", Static).add_class("shown")
            self.fit()

    def resume(self, client: Any) -> None:
        """A new connection: every live output view follows again."""
        for view in self.query(CallView):
            view.resume(client)

    def selected_call(self) -> str | None:
        """The call whose box has the focus (or holds the focused widget), if any."""
        node = self.app.focused
        while node is not None and node is not self:
            if isinstance(node, CallView):
                return node.call_id if node.call_id in self.call_ids() else None
            node = node.parent
        return None

    def call_ids(self) -> list[str]:
        return list(((self.lane or {}).get("tools") or {}))

