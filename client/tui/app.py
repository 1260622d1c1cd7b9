"""``DshApp``: the one screen of ``dsh tui`` -- sessions, the watched session, approvals, input.

Theory of operation: the app owns a ``client.tui.feed.DaemonFeed`` run in a Textual worker on
the app's asyncio loop; the feed is the one connection to dshd (an approval answerer) and
calls back ``feed_*`` on this app, which hand the values to the panes
(``client.tui.panes``): the session list polled each second, the watched session's lane view
(the sessions pane's cursor row picks it, held by session id across polls; ``session``
given at start picks it once: an id from ``dsh tui``, else resolved on the first connection
by ``client.tui.watching``, which says what it cannot find; a watched session removed is
said in a notification),
the banner when dshd is gone and while the feed connects again. Everything the person asks
for -- run a command, send a chat input, answer an approval, cancel, write to a PTY call --
is one request on the feed's live client in a worker, so the UI loop never waits on dshd; an
error answer becomes a notification, and with dshd gone the request is refused at once with
a message (nothing is queued to run later by surprise).

The command line runs ``tool.run`` of ``bash {command}`` pre-approved (``approved: true``: the
person typed it) in the watched session -- with none, a new session in the app's working
directory, titled by the line -- then waits for its result (``tool.wait``, in the worker) and shows it in the
session pane; a wait cut by dshd going away is said and asked again once dshd is back
(``client.tui.waiting``). With dshd away a line is refused and stays in the line. A pasted
text of several lines runs whole (``client.tui.commandline``). In chat mode (ctrl+t) or with
the ``> `` prefix the line is a chat input instead: ``turn.start``, or ``turn.steer`` while
the lane shows a turn. The approvals bar answers the oldest pending request of the watched session with ``approval.decide``; while another session
has one (the feed asks ``approval.list`` then), the bar names it and ``j`` watches that
session, so it can be answered. A terminal resize
reflows the panes (Textual's layout); nothing is cached by size.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Awaitable, Callable

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.widgets import Button, DataTable, Footer, Input, Static

from client.api import Client
from client.transport import DshClientError
from client.cli.keys import DEFAULT_DETACH_KEYS, describe_keys, parse_detach_keys
from client.tui.ansi import visible_line, visible_text
from client.tui.calls import call_command, is_tty
from client.tui.commandline import CommandLine, command_text
from client.tui.confirm import ConfirmScreen
from client.tui.feed import DaemonFeed
from client.tui.frames import freeze_long_lived, thaw_long_lived
from client.tui.help import HelpScreen
from client.tui.approvals import ARM_S, CommandScreen
from client.tui.panes import ApprovalsBar, SessionPane, SessionsPane, session_label
from client.tui.term import TerminalScreen
from client.tui.waiting import wait_result
from client.tui.watching import removed_text, resolve_wanted
from client.tui.turnlog import raw_tail
from protocol.approvals import PendingApproval
from protocol.methods import MAX_TITLE_CHARS, SessionInfo
from protocol.rpc import RpcError

__all__ = ["DshApp", "CHAT_PREFIX"]

#: A command line that starts with this is a chat input, whatever the mode.
CHAT_PREFIX = "> "

def while_mounted(method: Callable[..., Any]) -> Callable[..., Any]:
    """A feed callback or cursor event that comes while the app tears its screen down (the
    feed's worker and DataTable's messages outlive the widgets by a message or two) does
    nothing, instead of raising NoMatches out of the app."""
    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except NoMatches:
            return None
    return guarded


def wanted_id(sessions: list[SessionInfo], wanted: str) -> str | None:
    """The id of the session ``wanted`` names: an id first, else a name (never an unnamed
    session's missing name: the loop once matched ``None`` against every unnamed session
    after the one found, and watched the last of them)."""
    for info in sessions:
        if info.session_id == wanted:
            return info.session_id
    for info in sessions:
        if isinstance(info.name, str) and info.name == wanted:
            return info.session_id
    return None


_DECISIONS = {"once": "allow-once", "session": "allow-for-session", "reject": "reject"}


def banner_text(reason: str, retry_in: float) -> str:
    """One plain sentence: why dshd is away, how to start it (README), that the TUI retries."""
    reason = reason.split("; start it with", 1)[0].replace("`", "").strip().rstrip(".")
    when = f"next try in {retry_in:g} s" if retry_in else "trying now"
    return (f"dshd is not reachable: {reason}; start it with dshd & or make start in a dsh "
            f"clone, and this screen connects again by itself, {when}, while running calls "
            "keep running.")


class AttachKeys:
    """The keys of the attach screen (``client.tui.term.TerminalScreen``: every key but the
    detach sequence goes to the command), for the help screen."""

    HELP_NAME = "attach"
    BINDINGS: list = []
    EXTRA_KEYS = (
        (describe_keys(parse_detach_keys(DEFAULT_DETACH_KEYS)).lower(),
         "detach: back to the main screen (the call keeps running)"),
        ("any other key", "typed into the call (tool.write); a resize resizes its PTY"),
        ("any key, once the call ended", "back to the main screen"))


class DshApp(App[None], inherit_bindings=False):
    """``DshApp(socket, session)``: the TUI over the dshd at ``socket`` (None: the default)."""

    TITLE = "dsh tui"
    HELP_NAME = "main"
    ENABLE_COMMAND_PALETTE = False
    # The footer shows the short ``description`` (every word whole at 80 columns); the help
    # screen the ``tooltip`` when there is one (it holds the description: one line at 80).
    BINDINGS = [
        Binding("f1,question_mark", "help", "help"),
        Binding("ctrl+q", "quit", "quit"),
        # y / a / n / v are the approvals bar's own keys (focused: tab, f6, a click), so a
        # word typed elsewhere answers nothing; the function keys are never typed by chance.
        Binding("f2", "decide('once')", "allow once", show=False),
        Binding("f3", "decide('session')", "allow for session", show=False),
        Binding("f4", "decide('reject')", "reject", show=False),
        Binding("f6", "focus_approvals", "to the approvals bar", show=False),
        Binding("f5,j", "watch_asking", "watch it", show=False,
                tooltip="watch it: the other session that asks"),
        Binding("ctrl+t", "toggle_chat", "chat", tooltip="chat mode on/off"),
        Binding("ctrl+o", "attach", "attach", tooltip="attach PTY call"),
        # Priority: Input binds ctrl+k (delete to the end); the app's cancel goes first.
        Binding("ctrl+k", "cancel", "cancel", priority=True,
                tooltip="cancel turn / selected call (asks y)"),
        Binding("c", "cancel", "cancel", show=False),  # the help lists it with ctrl+k
        # Priority: the app takes these before it forwards the key, so the focus has moved
        # when the next key (typed right after, in the same read) is forwarded (check_action).
        Binding("colon,slash,i", "focus_input", "command line", show=False, priority=True),
        Binding("escape", "focus_sessions", "sessions list", show=False, priority=True),
        Binding("tab,shift+tab", "focus_next", "next pane", show=False),
    ]
    EXTRA_KEYS = (("up, down, enter, click", "sessions list: pick the session to watch"),
                  ("> text", "command line: a chat input (else: a bash command)"),
                  ("j, c", "letters: only outside the command line"),
                  ("y (cancel confirm)", f"yes, once shown {ARM_S:g} s; any other key: no"))
    CSS = """
    #banner { height: auto; background: $error; color: $text; padding: 0 1; display: none; }
    #banner.lost { display: block; }
    #main { height: 1fr; }
    #command { dock: bottom; }
    """

    def __init__(self, socket: Path | str | None = None, session: str | None = None, *,
                 connect: bool = True, resolve: bool = True) -> None:
        """``connect=False``: no feed (tests and snapshots feed values by hand).
        ``resolve=False``: ``session`` is an id already (``dsh tui`` resolved it), else it is
        resolved on the first connection (``client.tui.watching``)."""
        super().__init__()
        self.socket = socket
        self.wanted_session = session
        self._resolve = resolve and connect
        self.chat_mode = False
        self.lost_reason: str | None = None
        self.feed = DaemonFeed(socket, self)
        self._connect = connect
        self._sessions: list[SessionInfo] = []

    # -- layout --------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="banner")
        with Horizontal(id="main"):
            yield SessionsPane(id="sessions")
            yield SessionPane(client=(lambda: self.feed.client) if self._connect else None)
        yield ApprovalsBar()
        yield CommandLine(placeholder=self._placeholder(), id="command")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(SessionsPane).focus()
        self.call_after_refresh(freeze_long_lived)  # the screen is up: client.tui.frames
        if self._connect:
            self.feed_lost("connecting…", 0)
            self.run_worker(self.feed.run(), group="feed", exit_on_error=True)

    def on_unmount(self) -> None:
        thaw_long_lived()

    def _placeholder(self) -> str:
        if self.chat_mode:
            return "chat: type a message for the agent (ctrl+t: back to commands)"
        return "bash command to run in this session ('> text' or ctrl+t: chat)"

    # -- what the feed tells -------------------------------------------------------------
    @while_mounted
    def feed_connected(self) -> None:
        self.lost_reason = None
        self.query_one("#banner", Static).remove_class("lost")
        if self.feed.client is not None:
            self.query_one(SessionPane).resume(self.feed.client)
            for screen in self.screen_stack:
                if isinstance(screen, TerminalScreen):
                    screen.resume(self.feed.client)
        self.feed.watch(self.watched_id())

    async def feed_resolve(self, client: Client) -> None:
        """The session asked for at start, resolved once (``client.tui.watching``)."""
        if not self._resolve:
            return
        found, message = await resolve_wanted(client, self.wanted_session)
        self._resolve = False
        self.wanted_session = found
        if message is not None:
            self.notify(message, severity="error", timeout=30)

    @while_mounted
    def feed_lost(self, reason: str, retry_in: float) -> None:
        self.lost_reason = reason
        banner = self.query_one("#banner", Static)
        banner.update(Text(visible_text(banner_text(reason, retry_in))))
        banner.add_class("lost")

    @while_mounted
    def feed_sessions(self, sessions: list[SessionInfo]) -> None:
        watched = self.feed.watched
        gone = next((s for s in self._sessions if s.session_id == watched), None)
        if gone is not None and all(s.session_id != watched for s in sessions):
            self.notify(removed_text(gone), severity="warning", timeout=10)
        self._sessions = sessions
        pane = self.query_one(SessionsPane)
        pane.show(sessions)
        if self.wanted_session is not None:
            found = wanted_id(sessions, self.wanted_session)
            if found is not None and pane.select(found):
                self.wanted_session = None
        self.feed.watch(self.watched_id())

    @while_mounted
    def feed_lane(self, session_id: str, lane: Any) -> None:
        if session_id != self.feed.watched:
            return
        self.query_one(SessionPane).show(lane)
        self.query_one(ApprovalsBar).show(lane)

    @while_mounted
    def feed_approvals(self, pending: list[PendingApproval]) -> None:
        """Every pending request (``approval.list``): the oldest of another session is named
        on the bar, to be watched (``j``) and answered."""
        others = sorted((p for p in pending if p.session_id != self.feed.watched),
                        key=lambda p: (p.asked_at, p.approval_id))
        found = None
        if others:
            oldest = others[0]
            info = next((s for s in self._sessions if s.session_id == oldest.session_id), None)
            label = session_label(oldest.session_name, info.title if info else None,
                                  oldest.session_id)
            found = (oldest.session_id, label, oldest.summary, len(others) - 1)
        self.query_one(ApprovalsBar).show_elsewhere(found)

    def notify(self, message: str, *, markup: bool = False, **kwargs: Any) -> None:
        """Every notification as plain text, its controls and invisible characters shown
        as escapes: an error message may quote a command or a name from dshd."""
        super().notify(visible_text(str(message)), markup=False, **kwargs)

    def feed_error(self, message: str) -> None:
        self.notify(message, severity="error")

    @while_mounted
    def watched_id(self) -> str | None:
        return self.query_one(SessionsPane).selected_id()

    @on(DataTable.RowHighlighted, "#sessions")
    @while_mounted
    def _row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.feed.watch(self.watched_id())

    # -- requests --------------------------------------------------------------------------
    def request(self, what: str, body: Callable[[Client], Awaitable[Any]]) -> None:
        """Run ``body(client)`` in a worker; errors become a notification."""
        client = self.feed.client
        if client is None:
            self.notify(f"cannot {what}: dshd is not reachable", severity="error")
            return

        async def run() -> None:
            try:
                await body(client)
            except RpcError as exc:
                self.notify(f"{what}: {exc.message}", severity="error")
            except DshClientError as exc:
                self.notify(f"{what}: {exc}", severity="error")

        self.run_worker(run(), group="requests")

    @on(Input.Submitted, "#command")
    def _submitted(self, event: Input.Submitted) -> None:
        line = command_text(event.value).strip()  # a pasted text's lines, joined again
        if not line:
            return
        if self.feed.client is None:  # refused at once; the line keeps the text to run later
            self.notify("cannot run the command: dshd is not reachable; the line keeps it",
                        severity="error")
            return
        event.input.value = ""
        chat = self.chat_mode or line.startswith(CHAT_PREFIX.strip())
        text = line[1:].strip() if line.startswith(CHAT_PREFIX.strip()) else line
        session_id = self.watched_id()
        lane = self.query_one(SessionPane).lane or {}
        turn = lane.get("turn") if lane.get("session", {}).get("sessionId") == session_id else None

        async def body(client: Client) -> None:
            sid = session_id or await self._new_session(client, text)
            if not chat:
                started = await client.start_tool(sid, text, approved=True)
                result = await wait_result(self.feed, client, sid, started.call_id,
                                           lambda text: self.notify(text, severity="warning",
                                                                    timeout=10))
                live = self.feed.client or client  # the wait may have crossed a restart
                try:  # the raw end: a result's content has no \r (a progress bar's states)
                    raw: str | None = await raw_tail(live, sid, started.call_id)
                except (RpcError, DshClientError):
                    raw = None
                try:
                    self.query_one(SessionPane).show_result(sid, text, result, raw)
                except NoMatches:
                    return  # the app closed meanwhile
            elif turn:
                await client.steer_turn(sid, text)
            else:
                await client.start_turn(sid, text)

        self.request("chat" if chat else "run the command", body)

    async def _new_session(self, client: Client, first_input: str) -> str:
        """A new session, titled by its first input (as ``dsh run`` titles by the command)."""
        session_id = await client.create_session(os.getcwd(),
                                                 title=first_input[:MAX_TITLE_CHARS])
        self.wanted_session = session_id
        self.feed.watch(session_id)
        return session_id

    @on(Button.Pressed, "#approve-once")
    def _once(self) -> None:
        self.action_decide("once")

    @on(Button.Pressed, "#approve-session")
    def _for_session(self) -> None:
        self.action_decide("session")

    @on(Button.Pressed, "#reject")
    def _reject(self) -> None:
        self.action_decide("reject")

    @on(Button.Pressed, "#view-request")
    def _view(self) -> None:
        self.action_view_request()

    @on(Button.Pressed, "#watch-asking")
    def _watch_asking(self) -> None:
        self.action_watch_asking()

    # -- actions ---------------------------------------------------------------------------
    def action_decide(self, how: str) -> None:
        if self._connect and self.feed.client is None:
            self.notify("cannot decide: dshd is not reachable (the request is asked again "
                        "when it is back)", severity="error")
            return
        bar = self.query_one(ApprovalsBar)
        session_id = self.feed.watched
        if bar.approval is None or session_id is None:
            self.notify("nothing waits for an approval", severity="warning")
            return
        if not bar.armed():  # shown < ARM_S: a double tap must not decide it unseen
            self.notify("a new request just appeared: read it, then answer",
                        severity="warning")
            return
        approval_id = bar.approval[0]
        bar.approval = None  # one key, one decision: a second press waits for the next request
        bar.update_shown()
        self.request("decide", lambda c: c.decide_full(session_id, approval_id, _DECISIONS[how]))

    def action_watch_asking(self) -> None:
        """Watch the other session the bar says asks, so its request can be answered."""
        bar = self.query_one(ApprovalsBar)
        if bar.elsewhere is None:
            self.notify("no other session waits for an approval", severity="warning")
            return
        session_id = bar.elsewhere[0]
        bar.show_elsewhere(None)  # the next poll names the next one, if any
        if self.query_one(SessionsPane).select(session_id):
            self.feed.watch(session_id)
        else:
            self.wanted_session = session_id  # not listed yet: picked when it is

    def action_view_request(self) -> None:
        bar = self.query_one(ApprovalsBar)
        if bar.approval is None or bar.full_text is None:
            self.notify("nothing waits for an approval", severity="warning")
            return
        if not isinstance(self.screen, CommandScreen):
            self.push_screen(CommandScreen(bar.full_text.copy()))

    def action_toggle_chat(self) -> None:
        self.chat_mode = not self.chat_mode
        self.query_one("#command", Input).placeholder = self._placeholder()
        self.notify("chat mode" if self.chat_mode else "command mode", timeout=2)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The focus keys and cancel (ctrl+k is a priority key: the command line's Input
        binds it too) act on the main screen only (the help and attach screens have their
        own), and ``:``, ``/``, ``i`` are typed as text inside the command line."""
        if action == "cancel" and len(self.screen_stack) > 1:
            return False  # ctrl+k on the attach screen is the command's (and c, as typed)
        if action in ("focus_input", "focus_sessions"):
            if len(self.screen_stack) > 1:
                return False
            return action == "focus_sessions" or not isinstance(self.focused, Input)
        return True

    def action_focus_input(self) -> None:
        # At once, not ``Widget.focus()`` (a message later): the keys typed after the focus
        # key are already queued and are forwarded to whatever has the focus then.
        self.screen.set_focus(self.query_one("#command", Input))

    def action_focus_approvals(self) -> None:
        bar = self.query_one(ApprovalsBar)
        if bar.approval is None and bar.elsewhere is None:
            self.notify("nothing waits for an approval", severity="warning")
            return
        self.screen.set_focus(bar)

    def action_focus_sessions(self) -> None:
        self.screen.set_focus(self.query_one(SessionsPane))

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen([DshApp, ApprovalsBar, AttachKeys]))

    def action_cancel(self) -> None:
        """Cancel the turn (when one runs), else the selected call (the focused box), else
        the newest: after a confirmation (y)."""
        pane = self.query_one(SessionPane)
        lane = pane.lane or {}
        session_id = self.feed.watched
        tools = lane.get("tools") or {}
        if session_id is None:
            return
        if lane.get("turn"):
            question = f"cancel the turn {visible_line(lane['turn'].get('turnId'))}?"
            body: Callable[[Client], Awaitable[Any]] = lambda c: c.cancel_turn(session_id)
            what = "cancel the turn"
        elif tools:
            call_id = pane.selected_call() or max(
                tools, key=lambda c: (tools[c].get("startedAt") or 0, c))
            command = call_command(tools[call_id])
            question = f"cancel call {visible_line(call_id)} ($ {visible_line(command[:200])})?"
            body, what = (lambda c: c.cancel(session_id, call_id)), "cancel the call"
        else:
            self.notify("nothing runs in this session", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.request(what, body)

        self.push_screen(ConfirmScreen(question), answered)

    def action_attach(self) -> None:
        lane = self.query_one(SessionPane).lane or {}
        tools = lane.get("tools") or {}
        session_id = self.feed.watched
        ptys = [c for c in tools if is_tty(tools[c])]
        if not ptys or session_id is None:
            self.notify("no PTY call runs in this session (dsh run -t starts one)",
                        severity="warning")
            return
        call_id = max(ptys, key=lambda c: (tools[c].get("startedAt") or 0, c))
        if self.feed.client is None:
            self.notify("cannot attach: dshd is not reachable", severity="error")
            return
        self.push_screen(TerminalScreen(lambda: self.feed.client, session_id, call_id))
