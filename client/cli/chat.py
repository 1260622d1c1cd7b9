"""``dsh chat``: talk to a session's agent loop from a terminal, leave and re-join a turn
(PROTOCOL.md §3.5).

Theory of operation: ``dsh chat`` holds two connections. One subscribes to the session's lane
view and sends ``turn.start``; from then on the lane drives the screen
(``client.cli.turnscreen``; with ``--json`` the turn's events print as JSON lines instead,
:class:`JsonScreen`). The other is the session's approval answerer (:class:`Approver`): it
asks on the terminal (or allows every call with ``--yes``) and answers with
``approval.decide``. With no terminal and no ``--yes`` nobody can be asked, so stdin is never
read for an answer (piped lines are prompts only): the chat is no answerer and starts its
turns with ``askTimeout: 0``, so dshd decides a call ``unavailable`` at once unless another
answerer of the session is attached -- the truth, where "rejected" would not be. When stdin
ends on a terminal (Ctrl-D) with a request to answer, its answerer leaves; the request waits
``turn_ask_grace_seconds`` for another (PROTOCOL.md §3.4's one rule). When a call of the turn
settled ``APPROVAL_UNAVAILABLE``, dsh says no one could be asked and exits 125
(``client.exits.unanswered_status``) once the turn ends.

Leaving a turn: Ctrl-C once cancels it (``turn.cancel``) and the chat shows it unwinding; a
second Ctrl-C while it cancels leaves at once (status 130; the turn settles on its own in
dshd). On a terminal the detach sequence of ``dsh attach`` (``Ctrl-P Ctrl-Q``,
``--detach-keys``; ``client.cli.chatinput``) leaves the turn running (status 0) and says how
to re-join it (a call waiting for approval waits ``turn_ask_grace_seconds`` from the moment
no answerer is attached; a chat killed mid-turn is the same): ``dsh chat --attach SESSION`` shows the turn so far from the log (its input,
the steps' text, the calls and their results) and the current step's text from the lane,
then follows it live to its end; its status is the turn's (``client.exits.turn_status``: 0
completed, 1 error or interrupted, 130 cancelled). With no turn running it says so (0).
Without a prompt, lines are read from stdin, one turn each, until end of file.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

import anyio
import click
import msgspec

from client.api import CallLost, Client, connect
from client.cli.chatinput import Lines, TtyLines
from client.cli.common import run_program
from client.cli.keys import DEFAULT_DETACH_KEYS, describe_keys, detach_keys_option
from client.cli.sessionref import SESSION_REF, resolve_session
from client.cli.turnscreen import TurnScreen, note, turn_start_seq
from client.exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NEVER_RAN, EXIT_OK, single, \
    turn_status, unanswered_status
from client.transport import ConnectionLost
from protocol.events import TurnEndData
from protocol.rpc import RpcError

__all__ = ["chat", "run_chat", "ChatArgs"]

#: Most seconds the chat waits for its answerer's subscription to end when it leaves.
LEAVE_S = 5.0


@dataclass
class ChatArgs:
    socket: str | None
    session: str | None = None
    attach: str | None = None  # None: no --attach; "": the newest session of this directory
    prompt: str | None = None
    yes: bool = False
    sandbox: str | None = None
    policy: str | None = None
    name: str | None = None
    as_json: bool = False
    detach_keys: bytes = b""


class Approver:
    """The session's approval answerer for this chat, on its own connection (module doc)."""

    def __init__(self, client: Client, session_id: str, lines: Lines, yes: bool) -> None:
        self.client = client
        self.session_id = session_id
        self.lines = lines
        self.yes = yes
        self.left = False  # stdin ended with a request to answer: the answerer left
        self.seen: set[str] = set()
        self.pending: dict[str, dict] = {}
        self._sub: Any = None
        self._asking: tuple[str, anyio.CancelScope] | None = None
        self._send, self._receive = anyio.create_memory_object_stream[str](64)

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Subscribe (the answerer is in place when this has started), then answer."""
        self._sub = await self.client.subscribe(self.session_id)
        self.offer(await self._sub.next_view())
        task_status.started()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._watch)
            await self._ask_loop()
            tasks.cancel_scope.cancel()

    async def _watch(self) -> None:
        while True:
            self.offer(await self._sub.next_view())

    def offer(self, view: Any) -> None:
        """Queue the view's new approval requests; drop the question about one that left
        (decided elsewhere, or cancelled with its turn), so it does not eat the next line."""
        approvals = view.get("approvals") if isinstance(view, dict) else None
        approvals = approvals if isinstance(approvals, dict) else {}
        if self._asking is not None and self._asking[0] not in approvals:
            self._asking[1].cancel()
        for approval_id, entry in approvals.items():
            if approval_id in self.seen:
                continue
            try:
                self._send.send_nowait(approval_id)
            except anyio.WouldBlock:
                continue  # offered again with the next view
            self.seen.add(approval_id)
            self.pending[approval_id] = entry

    async def _ask_loop(self) -> None:
        async for approval_id in self._receive:
            entry = self.pending.pop(approval_id)
            with anyio.CancelScope() as scope:
                self._asking = (approval_id, scope)
                answered = await self._answer(approval_id, entry)
            self._asking = None
            if scope.cancelled_caught:
                note("\n── no longer pending", dim=True)
            elif not answered:
                await self._leave(entry)
                return

    async def _answer(self, approval_id: str, entry: dict) -> bool:
        """Ask and decide; False when nobody could be asked (stdin ended)."""
        summary = entry.get("summary", "")
        if self.yes:
            allow = True
            note(f"── allowing {entry.get('tool')}: {summary}", dim=True)
        else:
            answer = await self.lines.next(
                f"── allow {entry.get('tool')}: {summary}\n   run it? [y/N] "
            )
            if answer is None:
                return False
            allow = answer.strip().lower() in ("y", "yes")
        self._asking = None  # answered: its leaving the view from here on is our own doing
        try:
            await self.client.decide(self.session_id, approval_id, "allow" if allow else "reject")
        except RpcError as exc:  # decided meanwhile (cancelled, answerer left…)
            note(f"dsh: {exc.message}", dim=True)
        return True

    async def _leave(self, entry: dict) -> None:
        """Stop being the answerer: dshd decides what waits (and what comes) ``unavailable``,
        unless another answerer of the session decides first."""
        self.left = True
        note("\ndsh: stdin ended: this chat stops answering approvals; a waiting call waits "
             "turn_ask_grace_seconds for another answerer (dsh chat --attach --yes "
             f"{self.session_id}, or dsh approve), then it is unavailable", dim=True)
        with anyio.move_on_after(LEAVE_S, shield=True):
            await self._sub.aclose()


class JsonScreen:
    """``--json``: the turn's events, from its ``turn/start`` on, one JSON line each."""

    def __init__(self, client: Client, session_id: str, turn_id: str, after_seq: int) -> None:
        self.client, self.session_id, self.turn_id = client, session_id, turn_id
        self.after_seq = after_seq
        self.end: TurnEndData | None = None
        self.unavailable: set[str] = set()

    def open_call(self) -> None:
        return None

    async def replay_input(self) -> None:
        return None

    async def update(self, view: Any, ops: list) -> None:
        async for raw in self.client.iter_records(self.session_id, self.after_seq):
            event = msgspec.json.decode(raw)
            self.after_seq = event["seq"]
            sys.stdout.write(msgspec.json.encode(event).decode() + "\n")
            data = event.get("data") or {}
            if event.get("type") == "tool/result" and \
                    data.get("errorCode") == "APPROVAL_UNAVAILABLE":
                self.unavailable.add(str(data.get("callId")))
            if event.get("type") == "turn/end" and data.get("turnId") == self.turn_id:
                self.end = msgspec.convert(data, TurnEndData)
                break
        sys.stdout.flush()


# ---------------------------------------------------------------------- one turn
async def run_turn(client: Client, sub, session_id: str, text: str, lines: Lines,
                   as_json: bool, ask_timeout: float | None = None) -> int:
    """Start one turn and show it until it ends; its exit status (``ask_timeout``: 0 when
    this chat cannot answer, module doc)."""
    after_seq = (await client.get_session(session_id)).last_seq
    try:
        turn_id = await client.start_turn(session_id, text, ask_timeout)
    except RpcError as exc:
        if (exc.data or {}).get("code") != "TURN_RUNNING":
            raise
        note(f"dsh: a turn is running in session {session_id}: re-join it with "
             f"dsh chat --attach {session_id} (or steer it: dsh steer {session_id} TEXT)")
        return EXIT_ERROR
    screen = (JsonScreen if as_json else TurnScreen)(client, session_id, turn_id, after_seq)
    return await show_turn(client, sub, session_id, screen, lines)


async def rejoin(client: Client, sub, session_id: str, lines: Lines, as_json: bool) -> int:
    """``--attach``: the running turn so far, then live to its end (module doc)."""
    turn = sub.mirror.value.get("turn") if isinstance(sub.mirror.value, dict) else None
    if not isinstance(turn, dict):
        note(f"no turn is running in session {session_id}", dim=True)
        return EXIT_OK
    turn_id = turn["turnId"]
    start = await turn_start_seq(client, session_id, turn_id)
    after_seq = -1 if start is None else start - 1
    screen = (JsonScreen if as_json else TurnScreen)(client, session_id, turn_id, after_seq)
    note(f"dsh: re-joining turn {turn_id}", dim=True)
    await screen.replay_input()
    return await show_turn(client, sub, session_id, screen, lines)


async def watch_turn(client: Client, sub, session_id: str) -> int:
    """``dsh attach`` of a session whose turn runs: the turn so far, then live to its end, as
    ``dsh chat --attach`` shows it, without answering approvals; the turn's status."""
    return await rejoin(client, sub, session_id, Lines(), False)


async def show_turn(client: Client, sub, session_id: str, screen: Any, lines: Lines) -> int:
    try:
        left = await _follow_turn(client, sub, session_id, screen, lines)
    except BaseException as raised:  # noqa: BLE001 - re-raised, with the hint when dshd left
        lost = single(raised)
        call_id = screen.open_call()
        if call_id and isinstance(lost, ConnectionLost) and not isinstance(lost, CallLost):
            raise CallLost(lost, session_id, call_id) from raised
        raise
    if left is not None:
        return left
    end = screen.end
    reason = end.reason if end is not None else "error"
    if reason != "completed":
        parts = (end.error_code, end.message) if end is not None else ()
        detail = ": ".join(str(x) for x in parts if x)  # UNSET is falsy: left out
        note(f"dsh: turn {reason}" + (f" ({detail})" if detail else ""))
    status = turn_status(reason)
    unanswered = sorted(screen.unavailable)
    if unanswered:
        note(f"dsh: no one could be asked: {len(unanswered)} call(s) needed approval and "
             f"were decided unavailable ({', '.join(unanswered)}); pass --yes or run an "
             f"answerer (dsh attach --approve {session_id})")
        return unanswered_status(status)
    return status


async def _follow_turn(client: Client, sub, session_id: str, screen: Any,
                       lines: Lines) -> int | None:
    """Show the turn to its end (None), or the status of leaving it early (module doc)."""
    left: int | None = None
    rejoin_hint = f"dsh chat --attach {session_id}"
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async with anyio.create_task_group() as tasks:

            async def on_interrupt() -> None:
                nonlocal left
                cancelling = False
                async for _ in signals:
                    if not cancelling:
                        cancelling = True
                        note("\ndsh: cancelling the turn (Ctrl-C again to leave at once)")
                        tasks.start_soon(client.cancel_turn, session_id)
                        continue
                    note(f"\ndsh: left the turn while it cancels; it settles on its own in "
                         f"dshd (see how it ended: {rejoin_hint})")
                    left = EXIT_INTERRUPTED
                    tasks.cancel_scope.cancel()
                    return

            async def on_detach() -> None:
                nonlocal left
                await lines.detach.wait()
                note(f"\ndsh: detached; the turn keeps running in dshd. Re-join it: {rejoin_hint}"
                     f" (a call that needs approval waits turn_ask_grace_seconds for an "
                     f"answerer, then it is unavailable: re-join with --yes, or dsh approve)")
                left = EXIT_OK
                tasks.cancel_scope.cancel()

            tasks.start_soon(on_interrupt)
            tasks.start_soon(on_detach)
            view = sub.mirror.value
            while True:
                await screen.update(view, sub.mirror.last_ops)
                if screen.end is not None:
                    break
                view = await sub.next_view()
            tasks.cancel_scope.cancel()
    return left


# ---------------------------------------------------------------------- the command
async def _session(client: Client, args: ChatArgs) -> str:
    if args.attach is not None:
        return await resolve_session(client, args.attach or None)
    if args.session is not None:
        return await resolve_session(client, args.session)
    title = (args.prompt or "chat")[:60]
    return await client.create_session(os.getcwd(), title=title, sandbox=args.sandbox,
                                       approval_policy=args.policy, name=args.name)


async def _chat(args: ChatArgs) -> int:
    async with connect(args.socket) as client:
        session_id = await _session(client, args)
        note(f"session {session_id}", dim=True)
        tty = sys.stdin.isatty()
        lines = TtyLines(args.detach_keys) if tty and args.detach_keys else Lines()
        async with connect(args.socket, approvals=True) as answering:
            sub = await client.subscribe(session_id)
            try:
                await sub.next_view()
                with lines if isinstance(lines, TtyLines) else _nothing():
                    return await _turns(client, sub, session_id, args, lines, answering)
            finally:
                with anyio.move_on_after(1, shield=True):
                    await sub.aclose()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def _turns(client: Client, sub, session_id: str, args: ChatArgs, lines: Lines,
                 answering: Client) -> int:
    # No terminal, no --yes: nobody can be asked; stdin holds prompts, never answers.
    answers = args.yes or sys.stdin.isatty()
    grace = None if answers else 0.0
    async with anyio.create_task_group() as nursery:
        nursery.start_soon(lines.run)
        if answers:
            await nursery.start(Approver(answering, session_id, lines, args.yes).run)
        if args.attach is not None:
            status = await rejoin(client, sub, session_id, lines, args.as_json)
        elif args.prompt is not None:
            status = await run_turn(client, sub, session_id, args.prompt, lines,
                                    args.as_json, grace)
        else:
            status = EXIT_OK
            if isinstance(lines, TtyLines):
                note(f"(Ctrl-C cancels a turn; {describe_keys(args.detach_keys)} leaves it "
                     "running)", dim=True)
            while not lines.detach.is_set():
                line = await lines.next("› " if sys.stdin.isatty() else "")
                if line is None:
                    break
                if line.strip():
                    turn_status_ = await run_turn(client, sub, session_id, line, lines,
                                                  args.as_json, grace)
                    # One turn's call no one could be asked about stays the chat's status.
                    status = status if status == EXIT_NEVER_RAN else turn_status_
                    if lines.detach.is_set():
                        break
        nursery.cancel_scope.cancel()
    return status


def run_chat(args: ChatArgs) -> int:
    """Run the chat; map client errors to one stderr line and an exit status."""
    return run_program(lambda: _chat(args))


CHAT_HELP = """Ask the session's agent: stream its answer and its tool calls, asking before
each call.

With no PROMPT, read one prompt a line from stdin until end of file. Without --session or
--attach a new session is made (--sandbox, --policy, --name set it up).

\b
Leaving a turn:
  Ctrl-C          cancels the turn; Ctrl-C again while it cancels leaves
                  at once (status 130; the turn settles on its own)
  Ctrl-P Ctrl-Q   (on a terminal; --detach-keys) leaves the turn running
                  (status 0) and prints how to re-join it
  dsh chat --attach [SESSION]
                  re-joins a running turn: the turn so far, then live to
                  its end; the status is the turn's (0 completed, 1 error
                  or interrupted, 130 cancelled)

A call that needs approval is asked on the terminal (y/N). With no terminal and no --yes,
stdin is never read for answers (piped lines are prompts): no one can be asked, dshd
decides the call unavailable (unless another answerer is attached), the model is told,
and dsh exits 125 once the turn ends. A call whose chat left (detached, killed, Ctrl-D)
waits turn_ask_grace_seconds (default 120) for an answerer: dsh chat --attach --yes, or
dsh approve, answers it.
"""


@click.command("chat", help=CHAT_HELP)
@click.option("--session", "session_id", type=SESSION_REF, metavar="SESSION",
              help="Talk in this session (default: a new one).")
@click.option("--attach", "attach", type=SESSION_REF, is_flag=False, flag_value="",
              default=None, metavar="[SESSION]",
              help="Re-join the running turn of SESSION (default: the newest session of this "
              "directory).")
@click.option("--yes", is_flag=True,
              help="Allow every tool call the model proposes without asking (each is still "
              "logged, gated and sandboxed).")
@click.option("--sandbox", type=click.Choice(["read-only", "workspace-write",
                                              "danger-full-access"]),
              help="A new session's sandbox (default: dshd's config).")
@click.option("--policy", type=click.Choice(["ask", "never"]),
              help="A new session's approval policy (default: dshd's config).")
@click.option("--name", metavar="NAME", help="A new session's name (unique among yours).")
@click.option("--detach-keys", "detach_keys", default=DEFAULT_DETACH_KEYS, show_default=True,
              callback=detach_keys_option, metavar="KEYS",
              help='The sequence that leaves a turn running (docker\'s format; "" for none).')
@click.option("--json", "as_json", is_flag=True,
              help="Print the turn's events as JSON lines instead of text.")
@click.argument("prompt", nargs=-1)
@click.pass_context
def chat(ctx: click.Context, session_id: str | None, attach: str | None, yes: bool,
         sandbox: str | None, policy: str | None, name: str | None, detach_keys: bytes,
         as_json: bool, prompt: tuple[str, ...]) -> None:
    new_only = [flag for flag, value in (("--sandbox", sandbox), ("--policy", policy),
                                         ("--name", name)) if value is not None]
    if (session_id is not None or attach is not None) and new_only:
        raise click.UsageError(f"{', '.join(new_only)} set up a new session: not with "
                               "--session or --attach (dsh policy changes a session's policy)")
    if attach is not None and (session_id is not None or prompt):
        raise click.UsageError("--attach re-joins a running turn: no --session, no PROMPT")
    opts = ctx.obj
    args = ChatArgs(getattr(opts, "socket", None), session_id, attach,
                    " ".join(prompt) if prompt else None, yes, sandbox, policy, name,
                    as_json or bool(getattr(opts, "json", False)), detach_keys)
    sys.exit(run_chat(args))
