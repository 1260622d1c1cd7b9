"""One client connection, a pump: lines in, dispatch, answers out through one bounded queue.

Theory of operation (PROTOCOL.md §1–§2). A :class:`Connection` serves one
``trio.abc.HalfCloseableStream`` (a Unix socket in the daemon, a memory stream in the daemon
tests) for a peer whose uid it is given; who may connect, and how many at once, is the
server's business (``dshd.server``), and what a request does is ``dispatch``'s
(``dshd.handlers``), handed in as a callable. What it owns:

* The reader feeds the byte stream to a ``protocol.framing.LineBuffer``. A line longer than
  ``max_message_bytes`` is discarded through its newline and answered ``-32600``
  (``id: null``); invalid JSON gets ``-32700``; the connection stays open after both. The bytes
  of unfinished lines count against the daemon's one ``LineBudget`` (``max_buffered_bytes``);
  the connection whose bytes would pass it gets one ``-32013`` line and is closed (the refusal
  below).
* A line of ``offload_parse_bytes`` or more is parsed on a worker thread (at most
  ``PARSE_THREADS`` at once, daemon-wide), so one huge line never stalls the event loop; a
  worker that cannot be started is answered ``-32603`` with the reason. A batch of more than
  ``max_batch_entries`` is one ``-32600`` (``id: null``) and none of it runs.
* ``initialize`` is handled in line (it must come first; anything else before it gets
  ``-32002``). A connection that has not completed it ``initialize_timeout_seconds`` after it
  was accepted gets one ``-32002`` line and is closed (the refusal below): else a client that
  trickles a byte now and then without ever finishing a line holds a ``max_connections`` slot
  for ever, and enough of them lock everyone out. Every other request runs as its own task in
  the connection's handler nursery, so a ``tool.wait`` never holds up the requests behind it;
  at most ``max_requests_per_connection`` run at once (more get ``-32013``). A batch is one such
  task, and its answers are one array line, always; what a request runs after its answer
  (``subscribe``'s base batch) runs after the array is queued.
* End of input (a half-close, ``shutdown(SHUT_WR)``) stops reading, not answering: the
  requests in flight finish and their answers are sent, then the connection closes. A peer
  that closed its socket entirely is not waited for: its requests are cancelled. Telling the
  two apart needs the socket (``POLLHUP``), so the server passes that check in (``peer_gone``);
  without it the connection waits for its answers (the writer closes a peer that stops reading).
* One writer task drains one FIFO send queue. A line queued while the queue is empty and the
  writer is not in the middle of a line is first written to the socket at once
  (``os.write`` on its non-blocking fd): when the kernel takes all of it, that is the whole
  send (no writer wake-up, no scheduler pass: most answers go out so); what it does not take
  is queued for the writer, so the order of lines is the order they were queued, and a peer
  that does not read fills its socket buffer and then the queue. Responses are never dropped: when the bytes of
  queued responses pass their bound, the connection is closed. Stream batches have their own
  byte budget; a batch that does not fit is dropped for its subscription, which waits for a base
  batch that the writer asks for once the queue has drained (``Daemon.rebase``). The raw
  channel's followers (``dshd.sessions.follow``) are lossless instead: a follower reserves
  room for its next line (:meth:`Connection.reserve_follow`) before it reads the bytes, and
  waits while the follower lines queued on this connection hold ``send_queue_stream_bytes``
  (one line always fits), so a slow reader pauses its followers and the daemon holds at most
  that budget plus one line of them per connection. A peer that does not read for
  ``stalled_client_seconds`` is closed with a logged reason.
* A refusal (a peer that may not connect, a connection over a limit) is one error line, then
  ``dshd.streams_io.half_close_and_drain``: our side shuts its writing half and reads what
  the peer sent (bounded in bytes, ``REFUSE_DRAIN_BYTES``, and in time, a share of the stop
  budget) before closing, so the peer reads the line instead of a connection reset. Every time bound of a
  refusal or a close is a share of ``stop_timeout_seconds`` (``dshd.daemon.StopBudget``).
* At a graceful stop the server calls :meth:`Connection.finish`: reading stops and the
  connection ends as after a half-close, its answers in flight sent (within the stop budget).
* Followers run in the connection's handler nursery (:meth:`Connection.start_follower`), so
  they end with it: at a close, after a half-close once the answers in flight are sent, and
  at a graceful stop (``finish``) with the other handlers; a client resumes with
  ``tool.follow`` from the last offset it got.
* When the connection ends, the server ends its subscriptions (``Daemon.forget``); the
  sessions' tool calls keep running.
"""

from __future__ import annotations

import functools
import math
import os
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog
import trio

from protocol import rpc
from protocol.framing import NEED_DATA, LineBuffer, Oversize, OverBudget

from .daemon import Daemon
from .streams_io import close_stream, half_close_and_drain, refuse, socket_fd

__all__ = ["Answer", "Connection", "Dispatch", "Peer", "refuse"]

if TYPE_CHECKING:
    from .sessions.streams import Subscription

log = structlog.get_logger("dshd.connection")

#: After end of input, how often to look whether the peer closed entirely, seconds (a poll
#: interval, not a stop timeout).
PEER_CHECK_SECONDS = 0.5
#: Bytes asked of the stream per read.
READ_BYTES = 65536
#: Marks a follower's line in the send queue (its bytes count against the follower budget).
FOLLOW_LINE = "follow"

#: One answer of ``dispatch``: the line to send (None for a notification) and what to run
#: after it is queued (None, or e.g. a subscription's base batch).
Answer = tuple[bytes | None, Callable[[], None] | None]
#: ``dshd.handlers.dispatch``: runs one parsed message for a connection.
Dispatch = Callable[["Peer", Any], Awaitable[Answer]]

_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError)


class Peer(Protocol):
    """What a handler sees of its connection (``dshd.handlers``): who the peer is, what it said
    in ``initialize``, its subscriptions, and the sink they send through. :class:`Connection`
    is one; a handler needs nothing else of it."""

    id: int
    uid: int | None
    daemon: Daemon
    initialized: bool
    client: dict
    capabilities: dict
    subscriptions: dict[str, "Subscription"]

    def offer_stream(self, line: bytes, subscription: "Subscription") -> bool: ...

    def want_resync(self, subscription: "Subscription") -> None: ...

    async def reserve_follow(self, nbytes: int) -> None: ...

    def send_follow(self, line: bytes, reserved: int) -> None: ...

    def release_follow(self, reserved: int) -> None: ...


class Connection:
    """The pump of one connection (see the module docstring). ``uid`` is the peer's, already
    admitted by the server; ``peer_gone`` tells a full close from a half-close (optional)."""

    def __init__(self, daemon: Daemon, stream: trio.abc.HalfCloseableStream, uid: int | None,
                 dispatch: Dispatch, *, peer_gone: Callable[[], bool] | None = None) -> None:
        self.id = daemon.mint_connection_id()
        self.daemon = daemon
        self.config = daemon.config
        self.stream = stream
        self.uid = uid
        self.initialized = False
        self.client: dict = {}
        self.capabilities: dict = {}
        self.subscriptions: dict[str, "Subscription"] = {}
        self._dispatch = dispatch
        self._peer_gone = peer_gone
        #: Lines waiting for the writer: (bytes left to send, what they are, their full size).
        self._queue: deque[tuple[bytes | memoryview, "Subscription | str | None", int]] = deque()
        #: The socket's fd for the fast path of :meth:`_push` (None: a stream without one, or
        #: the connection is ending); ``_sending``: the writer is in the middle of a line.
        self._fd: int | None = socket_fd(stream)
        self._sending = False
        #: The followers of this connection (``dshd.sessions.follow``), by followId.
        self.followers: dict[str, Any] = {}
        self._follow_bytes = 0  # reserved or queued by followers (see reserve_follow)
        # Followers waiting for room: all of them wake when bytes were sent or released
        # (one Event per waiter, replaced by each new waiter, lost every wake but the last).
        self._follow_room = trio.lowlevel.ParkingLot()
        self._next_follow = 0
        self._stream_bytes = 0
        self._response_bytes = 0
        self._wakeup = trio.Event()
        self._resync: dict[str, "Subscription"] = {}
        self._in_flight = 0
        self._progress = trio.Event()  # set when a request finishes or a response is sent
        self._lines = LineBuffer(self.config.max_message_bytes, daemon.line_budget)
        self._closing = False
        self._nursery: trio.Nursery | None = None
        self._init_deadline: trio.CancelScope | None = None  # until initialize is completed
        self._reading = trio.CancelScope()  # cancelled by finish(): read no more
        self.log = log.bind(conn=self.id, uid=uid)

    # ------------------------------------------------------------------ sending
    def _push(self, line: bytes, sub: "Subscription | str | None") -> None:
        """Send ``line`` now when nothing is queued or being sent and the socket takes it all
        (the fast path: no writer wake-up, no scheduler pass); else queue what is left."""
        data: bytes | memoryview = line
        if self._fd is not None and not self._queue and not self._sending:
            try:
                sent = os.write(self._fd, line)
            except OSError:  # full (EAGAIN), or broken: the writer's send_all says which
                sent = 0
            if sent == len(line):
                self._sent(sub, len(line))
                return
            data = memoryview(line)[sent:]
        self._queue.append((data, sub, len(line)))
        self._wakeup.set()

    def _sent(self, sub: "Subscription | str | None", charge: int) -> None:
        """A queued line of ``charge`` bytes is out: give its bytes back to its budget."""
        if sub is None:
            self._response_bytes -= charge
            self._progress.set()
        elif sub is FOLLOW_LINE:
            self._follow_bytes -= charge
            self._follow_room.unpark_all()
        else:
            self._stream_bytes -= charge

    def send_line(self, line: bytes) -> None:
        """Queue a response line. Never dropped; a connection that hoards them is closed."""
        if self._closing:
            return
        self._response_bytes += len(line)
        if self._response_bytes > self.config.send_queue_response_bytes:
            self.close("responses piled up past send_queue_response_bytes: the client stopped reading")
            return
        self._push(line, None)

    def offer_stream(self, line: bytes, subscription: "Subscription") -> bool:
        """Queue a stream notification if the stream budget allows (StreamSink)."""
        if self._closing:
            return True  # nothing to resync on a closing connection
        if self._stream_bytes + len(line) > self.config.send_queue_stream_bytes and self._stream_bytes:
            return False
        self._stream_bytes += len(line)
        self._push(line, subscription)
        return True

    def want_resync(self, subscription: "Subscription") -> None:
        self._resync[subscription.id] = subscription
        self._wakeup.set()

    async def reserve_follow(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more follower bytes fit ``send_queue_stream_bytes`` (or none
        are queued: one line always fits), then hold them; a follower calls this before it
        reads the bytes it will send (:meth:`send_follow`, or :meth:`release_follow`)."""
        limit = self.config.send_queue_stream_bytes
        while self._follow_bytes and self._follow_bytes + nbytes > limit:
            await self._follow_room.park()
        self._follow_bytes += nbytes

    def send_follow(self, line: bytes, reserved: int) -> None:
        """Queue a follower's line in the room it reserved (never dropped)."""
        self._follow_bytes += len(line) - reserved
        if self._closing:
            self.release_follow(len(line))
            return
        self._push(line, FOLLOW_LINE)

    def release_follow(self, reserved: int) -> None:
        """Give back reserved room that no line took (a follower that ended or was cancelled)."""
        self._follow_bytes -= reserved
        self._follow_room.unpark_all()

    def mint_follow_id(self) -> str:
        self._next_follow += 1
        return f"follow-{self._next_follow}"

    def start_follower(self, run: Callable[[], Awaitable[None]]) -> None:
        """Run a follower in the handler nursery: it ends with the connection (module doc)."""
        if self._nursery is not None and not self._closing:
            self._nursery.start_soon(run)

    def finish(self) -> None:
        """The daemon stops: read no more, answer what is in flight, then close, as after a
        half-close (the caller bounds how long that may take)."""
        self._reading.cancel()

    def close(self, reason: str) -> None:
        if not self._closing:
            self._closing = True
            self.log.warning("connection.closed", reason=reason)
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()

    async def _writer(self) -> None:
        stalled = self.config.stalled_client_seconds
        while True:
            if not self._queue:
                if self._resync:
                    pending, self._resync = self._resync, {}
                    for sub in pending.values():
                        if sub.id in self.subscriptions:
                            self.daemon.rebase(sub)
                    continue
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            line, sub, charge = self._queue.popleft()
            # A follower's line waits as long as its reader pauses (lossless, bounded by the
            # follower budget: PROTOCOL.md §3.2); everything else is held to the stall bound.
            self._sending = True  # the fast path (_push) waits behind this line
            try:
                with trio.move_on_after(math.inf if sub is FOLLOW_LINE else stalled) as scope:
                    try:
                        await self.stream.send_all(line)
                    except _CLOSED:
                        self.close("the client went away")
                        return
            finally:
                self._sending = False
            self._sent(sub, charge)
            if scope.cancelled_caught:
                self.close(f"the client did not read for {stalled:g} s")
                return

    # ------------------------------------------------------------------ receiving
    async def run(self) -> None:
        """Serve until end of input and the answers in flight are sent, a refusal, or a close."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                try:
                    ended = False
                    with self._reading:
                        ended = await self._read_with_init_deadline(nursery)
                    if ended or self._reading.cancelled_caught:
                        await self._answer_in_flight()
                finally:
                    nursery.cancel_scope.cancel()
        except* _CLOSED:
            pass  # the peer went away: nothing to answer
        finally:
            self._fd = None  # never write to a closed (and maybe reused) fd number
            self._lines.close()
            await close_stream(self.stream, self.daemon.stop_budget)

    async def _read_with_init_deadline(self, nursery: trio.Nursery) -> bool:
        """:meth:`_reader` under the ``initialize`` deadline (see the module doc); False when
        the connection was refused."""
        timeout = self.config.initialize_timeout_seconds
        with trio.move_on_after(timeout) as self._init_deadline:
            return await self._reader(nursery)
        await self._refuse(
            rpc.NOT_INITIALIZED,
            f"not initialized: this connection did not complete initialize within "
            f"initialize_timeout_seconds ({timeout:g} s) and is closed: send initialize "
            "first, right after connecting",
        )
        self.log.warning("connection.refused", reason="initialize deadline passed",
                         initialize_timeout_seconds=timeout)
        return False

    async def _answer_in_flight(self) -> None:
        """After end of input: wait until every request in flight is answered and every
        response is sent (the writer closes a peer that stops reading). A peer that closed
        both halves (not a half-close) is not waited for: its requests are cancelled."""
        while (self._in_flight or self._response_bytes) and not self._closing:
            if self._peer_gone is not None and self._peer_gone():
                return
            self._progress = trio.Event()
            with trio.move_on_after(PEER_CHECK_SECONDS):
                await self._progress.wait()

    async def _refuse(self, code: int, message: str) -> None:
        """Queue one error line, let the writer send it (bounded), then half-close and drain."""
        budget = self.daemon.stop_budget
        self.send_line(rpc.encode_error(None, code, message))
        with trio.move_on_after(budget.refuse_send):
            await self._wait_responses_sent()
        self._closing = True
        self._queue.clear()  # nothing more goes out; the writer finishes at most one line
        await half_close_and_drain(self.stream, budget)

    async def _wait_responses_sent(self) -> None:
        while self._response_bytes and not self._closing:
            self._progress = trio.Event()
            await self._progress.wait()

    async def _reader(self, nursery: trio.Nursery) -> bool:
        """Read and handle lines until end of input (True), or until this connection is
        refused for passing the daemon's line budget (False)."""
        lines = self._lines
        while True:
            event = lines.next_event()
            if event is NEED_DATA:
                try:
                    data = await self.stream.receive_some(READ_BYTES)
                except _CLOSED:
                    return True
                if not data:
                    return True
                lines.feed(data)
            elif isinstance(event, Oversize):
                self._oversize(event.limit)
            elif isinstance(event, OverBudget):
                await self._refuse(rpc.LIMIT_EXCEEDED, self._over_budget())
                return False
            else:
                await self._on_line(event, nursery)

    def _over_budget(self) -> str:
        return (
            f"limit exceeded: unfinished lines of all connections passed max_buffered_bytes "
            f"({self.config.max_buffered_bytes} bytes); this connection is closed: "
            "reconnect and send shorter lines, or fewer at once"
        )

    def _oversize(self, limit: int) -> None:
        self.send_line(
            rpc.encode_error(
                None, rpc.INVALID_REQUEST,
                f"message longer than max_message_bytes ({limit} bytes); it was discarded",
            )
        )

    async def _parse(self, line: bytes | bytearray) -> rpc.Messages:
        """``rpc.parse_message``, on a worker thread for a long line (see the module doc)."""
        parse = functools.partial(rpc.parse_message, line, max_batch=self.config.max_batch_entries)
        if len(line) < self.config.offload_parse_bytes:
            return parse()
        try:
            return await trio.to_thread.run_sync(parse, limiter=self.daemon.parse_limiter)
        except RuntimeError as exc:  # no thread could be started (pids limit, memory)
            self.log.error("connection.parse_thread_failed", error=str(exc), bytes=len(line))
            out = rpc.Messages()
            out.append(rpc.RpcError(
                rpc.INTERNAL_ERROR,
                f"internal error: dshd could not start a thread to parse this "
                f"{len(line)}-byte message ({exc}); it was not run: retry, or send shorter lines",
            ))
            return out

    async def _on_line(self, line: bytes | bytearray, nursery: trio.Nursery) -> None:
        parsed = await self._parse(line)
        if parsed.is_batch:
            if not self._admit(None):
                return
            nursery.start_soon(self._run_batch, list(parsed))
            return
        item = parsed[0]
        if isinstance(item, rpc.RpcError):  # the line itself is refused: answer at once
            self.send_line(rpc.encode_error(item.id, item.code, item.message, item.data))
            return
        if isinstance(item, rpc.Request) and item.method == "initialize":
            self._deliver(await self._dispatch(self, item))
            if self.initialized and self._init_deadline is not None:
                self._init_deadline.deadline = math.inf
            return
        if not self._admit(item):
            return
        nursery.start_soon(self._run_one, item)

    def _deliver(self, answer) -> None:
        line, then = answer
        if line is not None:
            self.send_line(line)
        if then is not None:
            then()

    def _admit(self, item) -> bool:
        if self._in_flight >= self.config.max_requests_per_connection:
            rid = item.id if isinstance(item, rpc.Request) else None
            self.send_line(
                rpc.encode_error(rid, rpc.LIMIT_EXCEEDED,
                                 f"too many requests in flight on this connection "
                                 f"(max {self.config.max_requests_per_connection}); wait for answers")
            )
            return False
        self._in_flight += 1
        return True

    def _done(self) -> None:
        self._in_flight -= 1
        self._progress.set()

    async def _run_one(self, item) -> None:
        try:
            self._deliver(await self._dispatch(self, item))
        finally:
            self._done()

    async def _run_batch(self, items: list) -> None:
        """Every entry runs at once; their answers go out as one array line, and only then
        what an entry runs after its answer (a subscription's base batch)."""
        try:
            answers: list = [None] * len(items)

            async def one(i: int, item) -> None:
                answers[i] = await self._dispatch(self, item)

            async with trio.open_nursery() as n:
                for i, item in enumerate(items):
                    n.start_soon(one, i, item)
            line = rpc.encode_batch([a[0] for a in answers if a[0] is not None])
            if line:
                self.send_line(line)
            for _, then in answers:
                if then is not None:
                    then()
        finally:
            self._done()
