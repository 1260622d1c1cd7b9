"""The interactive approval answerer (PROTOCOL.md §3.4): ``dsh attach --approve`` (``dsh
approvals``, ``dsh approve`` and ``dsh policy`` are ``client.cli.approvals``').

Theory of operation of the answerer (``answer_session``): the connection is an answerer; it
subscribes to the session's lane and shows its calls like ``dsh attach`` while an ``Answerer``
asks y/n on stdin for each pending request, one at a time, in the order they came. Four tasks
and ONE bounded channel of events, read by ``_attend`` alone:

- ``_forward`` hands the lane views over one at a time (``ViewShown``) and waits until each
  was shown: the view is the mirror's live value, the next batch changes it;
- ``Answerer.run`` takes the queued requests (its own bounded queue, fed by ``_attend``
  through ``Answerer.offer``/``queue_new``): shows one (the sandbox mode is SessionInfo's,
  asked per request, else the lane's), reads the answer (``client.cli.answer.LineReader``),
  sends ``approval.decide`` holding ``deciding`` until the outcome is printed (the call's
  output never comes before it), then reports ``Answered``, or ``StdinClosed`` when no answer
  can come;
- ``LineReader.run`` reads stdin; ``keep_up`` polls spill files (holding ``deciding`` too).

``_attend`` ends a prompt whose request left the lane (decided elsewhere: it says how, from
the log) and, without ``--follow``, ends the command once no call is in the lane and no
request is pending or being answered. A closed stdin with a request unanswered detaches with
status 1.

Across a daemon restart (``answer_across_restarts``): the answerer starts again on a new
connection, an answerer again (``client.link``), and shows every request still pending --
one asked again after the restart keeps its ``approvalId``; stdin's ``LineReader`` is the
same throughout, so no typed or piped answer is lost in between, and so are the calls
followed (``Watchers``) and the ``Printer``: a call goes on from what was shown, and one that
ended while dshd was away (gone from the new lane) gets the rest of its output and its end
line, as under ``dsh attach --follow``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
from msgspec import UNSET
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from client.api import Client
from client.cli.answer import LineReader, Outcomes, parse_answer, request_lines
from client.cli.output import Printer, Watchers, followed, keep_up, show_calls
from client.cli.terminal import end_line, note, prompt
from client.exits import EXIT_ERROR
from client.link import Link, ride
from client.subscription import Subscription
from protocol.rpc import ALREADY_DECIDED, APPROVAL_NOT_FOUND, RpcError

__all__ = ["answer_session", "answer_across_restarts", "Answerer"]

#: Events in flight to ``_attend``; requests queued for the answerer (more wait for a view).
EVENT_BOUND = 16
QUEUE_BOUND = 256


@dataclass(frozen=True)
class ViewShown:
    view: Any
    shown: anyio.Event


@dataclass(frozen=True)
class Answered:
    approval_id: str


@dataclass(frozen=True)
class StdinClosed:
    approval_id: str


AttendEvent = ViewShown | Answered | StdinClosed
Events = MemoryObjectSendStream[AttendEvent]


class _StdinClosed(Exception):
    """No answer can come: stdin reached its end while a request waited for one."""


class Answerer:
    """Answers a session's approval requests, one at a time (module doc)."""

    def __init__(self, client: Client, session_id: str, reader: LineReader, printer: Printer,
                 deciding: anyio.Lock, outcomes: Outcomes) -> None:
        self.client, self.session_id = client, session_id
        self.reader, self.printer, self.deciding, self.outcomes = reader, printer, deciding, outcomes
        #: The pending requests of the last view, by id; requests ever queued.
        self.live: dict[str, Any] = {}
        self._seen: set[str] = set()
        #: Queued or being answered, not finished yet; requests shown to the user.
        self.unfinished = 0
        self.asked = 0
        self._lane_mode: Any = None
        self._prompt: tuple[str, anyio.CancelScope] | None = None
        self._send, self._queue = anyio.create_memory_object_stream[str](QUEUE_BOUND)

    @property
    def idle(self) -> bool:
        return not self.live and not self.unfinished

    async def offer(self, view: Any) -> None:
        """Take a view's pending requests; end the prompt of one that left (decided elsewhere)."""
        session = view.get("session") if isinstance(view, dict) else None
        if isinstance(session, dict):
            self._lane_mode = session.get("sandbox", self._lane_mode)
        approvals = view.get("approvals") if isinstance(view, dict) else None
        self.live = dict(approvals) if isinstance(approvals, dict) else {}
        if self._prompt is not None and self._prompt[0] not in self.live:
            approval_id, scope = self._prompt
            scope.cancel()
            self._prompt = None
            end_line()  # end the prompt's line
            await self._gone(approval_id)

    def queue_new(self) -> None:
        """Queue the requests never queued; when the queue is full, the next view offers them."""
        for approval_id in self.live:
            if approval_id in self._seen:
                continue
            try:
                self._send.send_nowait(approval_id)
            except anyio.WouldBlock:
                return
            self._seen.add(approval_id)
            self.unfinished += 1

    async def run(self, events: Events) -> None:
        async with events:
            async for approval_id in self._queue:
                try:
                    await self._answer(approval_id)
                except _StdinClosed:
                    await events.send(StdinClosed(approval_id))
                    return
                self.unfinished -= 1
                await events.send(Answered(approval_id))

    async def _answer(self, approval_id: str) -> None:
        run_mode = await self._sandbox_mode() if approval_id in self.live else None
        if approval_id not in self.live:
            await self._gone(approval_id)  # decided before its turn came
            return
        self.printer.pause()
        self.asked += 1
        provider = self.client.server.sandbox if self.client.server else None
        lines = request_lines(self.session_id, approval_id, self.live[approval_id], run_mode,
                              provider)
        note(lines[0], "bold")
        for line in lines[1:]:
            note(line)
        decision = await self._ask(approval_id)
        if decision is None:  # the prompt was ended: ``offer`` said why
            return
        async with self.deciding:
            await self._decide(approval_id, decision)

    async def _ask(self, approval_id: str) -> str | None:
        """Read y/n until one comes; None when the prompt was ended (the request left)."""
        with anyio.CancelScope() as scope:
            self._prompt = (approval_id, scope)
            try:
                since = anyio.current_time()
                while True:
                    prompt("allow it once? [y/n] ")
                    line = await self.reader.line(since)
                    if line is None:
                        end_line()
                        raise _StdinClosed(approval_id)
                    if not self.reader.tty:
                        end_line(line)  # a transcript reads like the session did
                    decision = parse_answer(line)
                    if decision is not None:
                        return decision
                    note("answer y (allow it once) or n (reject it)")
                    since = anyio.current_time()
            finally:
                self._prompt = None
        return None

    async def _sandbox_mode(self) -> Any:
        # SessionInfo's mode is the one calls run under; the lane's ``session.sandbox`` is
        # the fallback (dshd's lane has shown the config default instead of the mode given to
        # session.create: the person deciding must see the real one).
        try:
            mode = (await self.client.get_session(self.session_id)).sandbox
        except RpcError:
            mode = None
        return mode or self._lane_mode  # UNSET (a damaged session) is falsy too

    async def _gone(self, approval_id: str) -> None:
        outcome = await self.outcomes.lookup(approval_id)
        note(f"── approval {approval_id} was decided elsewhere: "
             f"{outcome or 'no longer pending'}", "bold")

    async def _decide(self, approval_id: str, decision: str) -> None:
        try:
            outcome = await self.client.decide(self.session_id, approval_id, decision)
        except RpcError as exc:
            if exc.code == ALREADY_DECIDED:
                done = exc.data.get("outcome") if isinstance(exc.data, dict) else None
                note(f"── approval {approval_id} was already decided elsewhere: {done}", "bold")
                return
            if exc.code == APPROVAL_NOT_FOUND:
                note(f"── approval {approval_id} is gone: {exc.message}", "bold")
                return
            raise
        note(f"── approval {approval_id}: {outcome}", "bold")


async def answer_session(client: Client, session_id: str, follow: bool, *,
                         stdin_fd: int = 0, reader: LineReader | None = None,
                         shown: tuple[Watchers, Printer] | None = None) -> int:
    """``dsh attach --approve`` (module doc); returns the exit status. ``reader``: stdin's
    lines read by the caller (``answer_across_restarts``), else read here. ``shown``: the
    calls followed and the printer of an earlier connection (``answer_across_restarts``),
    so that a call goes on from what was shown and one that settled meanwhile gets its end."""
    start = await client.get_session(session_id)
    outcomes = Outcomes(client, session_id, -1 if start.last_seq is UNSET else start.last_seq)
    own_reader = reader is None
    reader = LineReader(stdin_fd) if reader is None else reader
    watchers, printer = shown if shown is not None else ({}, Printer())
    deciding = anyio.Lock()
    answerer = Answerer(client, session_id, reader, printer, deciding, outcomes)
    send, receive = anyio.create_memory_object_stream[AttendEvent](EVENT_BOUND)
    async with await client.subscribe(session_id) as sub:
        async with anyio.create_task_group() as tasks:
            if own_reader:
                tasks.start_soon(reader.run)
            tasks.start_soon(_forward, sub, send.clone())
            tasks.start_soon(answerer.run, send.clone())
            tasks.start_soon(keep_up, followed(watchers, printer), deciding)
            status = await _attend(receive, client, session_id, sub, answerer, watchers,
                                   printer, follow)
            tasks.cancel_scope.cancel()
    return status


async def answer_across_restarts(link: Link, session_id: str, follow: bool) -> int:
    """``answer_session`` on the link's connection, again on a new one after dshd restarted
    (``client.link.ride``: a request still pending, or asked again, is shown again; the calls
    followed and the ``Printer`` are the same throughout, as for ``dsh attach --follow``, so
    a call that ended while dshd was away gets the rest of its output and its end). stdin is
    read by ONE ``LineReader`` for the whole command: a reader of a lost connection's answerer
    would leave its thread behind, and that thread would swallow the next answer."""
    reader = LineReader(0)
    shown: tuple[Watchers, Printer] = ({}, Printer())
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(reader.run)
        try:
            return await ride(link, lambda client: answer_session(
                client, session_id, follow, reader=reader, shown=shown), note)
        finally:
            tasks.cancel_scope.cancel()


async def _forward(sub: Subscription, events: Events) -> None:
    async with events:
        async for view in sub:
            shown = anyio.Event()
            await events.send(ViewShown(view, shown))
            await shown.wait()


async def _attend(events: MemoryObjectReceiveStream[AttendEvent], client: Client,
                  session_id: str, sub: Subscription, answerer: Answerer, watchers: Watchers,
                  printer: Printer, follow: bool) -> int:
    async for event in events:
        if isinstance(event, StdinClosed):
            note(f"dsh: stdin is closed, so nobody can answer approval {event.approval_id} "
                 "here; detaching (another answerer may decide it, else it ends unavailable)")
            return EXIT_ERROR
        if isinstance(event, ViewShown):
            await answerer.offer(event.view)
            async with answerer.deciding:
                await show_calls(client, session_id, sub, event.view, watchers, printer)
            answerer.queue_new()
            event.shown.set()
        if not follow and not watchers and answerer.idle:
            if not printer.headers and not answerer.asked:
                note(f"no call is running and no approval is pending in session {session_id}",
                     "dim")
            return 0
    return 0

