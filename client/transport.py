"""JSON-RPC 2.0 over one Unix stream socket, NDJSON framed (PROTOCOL.md §1), on anyio: the
same code runs under trio and asyncio.

Theory of operation: a ``Connection`` owns one byte stream (an ``anyio.abc.ByteStream``) and
two tasks that live in the task group of ``open_connection``. The *writer* task is the only one that writes: callers hand it
whole lines through a bounded channel, so a caller cancelled mid-call never leaves half a line
on the wire. The *reader* task is the only one that reads: it splits lines, decodes each and

- hands a response to the call waiting on its ``id`` (running that call's ``on_result`` hook
  first, in the reader, so that a ``subscribe`` registers its inbox before the reader looks at
  the next line -- the first ``stream`` notification follows the response at once);
- puts a ``stream`` notification into the ``Inbox`` of its ``subscriptionId``. An inbox is
  bounded and the reader never waits on it: when it is full the inbox is marked overflowed and
  emptied, and its consumer learns it must subscribe again (a fresh base batch);
- puts an ``output`` notification (``tool.follow``'s raw bytes, HOST.md §6) into the
  ``FollowInbox`` of its ``followId``. Those are lossless: nothing is ever dropped. Instead,
  once an inbox holds ``FOLLOW_INBOX_BYTES`` the reader stops reading the socket until its
  consumer took some, so the daemon's follower pauses (its send queue fills) -- back-pressure
  end to end, with the client's memory bounded by that budget plus one read;
- keeps an error response with ``id: null`` (the daemon says why it closes, e.g. ``-32001``)
  and raises it to the calls still waiting when the connection ends.

When the stream ends or breaks every waiting call and every inbox is failed with
``ConnectionLost`` (or that kept error); calls made later fail at once. Lines are split by
``protocol.framing.LineBuffer``, the framing the daemon uses too (sans-IO: feed bytes, get
whole lines, a bound on a line's length); the client's policy for a line from dshd over its
limit (``max_line_bytes``) is to end the connection (``ConnectionLost``) as soon as the line
passes the limit.

Errors (a tree, mapped once here): ``DshClientError`` > ``DaemonNotRunning`` (in ``api``),
``ConnectionLost``; ``RpcError`` (``protocol.rpc``) is what the daemon answered.
"""

from __future__ import annotations

import itertools
from collections import deque
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import anyio
import anyio.abc
import msgspec

from protocol.framing import NEED_DATA, LineBuffer, Oversize
from protocol.methods import StreamParams
from protocol.rpc import (
    ErrorResponse,
    Notification,
    Response,
    RpcError,
    decode_params,
    encode_request,
    parse_message,
)

__all__ = [
    "DshClientError",
    "ConnectionLost",
    "InboxOverflow",
    "Inbox",
    "FollowInbox",
    "FOLLOW_INBOX_BYTES",
    "Connection",
    "open_connection",
    "MAX_LINE_BYTES",
    "DEFAULT_INBOX_BOUND",
]

#: Longest line the client accepts from the daemon (a base batch of a busy lane is ~1 MB).
MAX_LINE_BYTES = 64 * 1024 * 1024
#: Stream batches queued per subscription before the client gives up on it and resubscribes.
DEFAULT_INBOX_BOUND = 512
_SEND_QUEUE = 64
#: Bytes (of ``output`` notification params) a follower's inbox holds before the reader waits.
FOLLOW_INBOX_BYTES = 4 * 1024 * 1024
_READ_CHUNK = 65536


class DshClientError(Exception):
    """Base of the client's own errors (not the daemon's answers, which are ``RpcError``)."""


class ConnectionLost(DshClientError):
    """The connection to dshd ended; calls in flight and subscriptions are gone."""


def _lost(exc: BaseException) -> ConnectionLost:
    """``ConnectionLost`` naming why: anyio's stream errors often carry no text of their own
    (the OS error is their cause), and "connection to dshd lost: " helps nobody."""
    why = str(exc) or str(exc.__cause__ or "") or type(exc).__name__
    return ConnectionLost(f"connection to dshd lost: {why}")


class InboxOverflow(DshClientError):
    """A subscription fell behind and stream batches were dropped: subscribe again."""


class _BadMessage(Exception):
    """The daemon sent a line that is not valid JSON-RPC: the connection cannot be trusted."""


class _LineTooLong(Exception):
    """The daemon sent a line longer than the bound: the connection cannot go on."""


class Inbox:
    """Bounded queue of ``(seq, wire_ops)`` batches for one subscription, fed by the reader."""

    def __init__(self, bound: int = DEFAULT_INBOX_BOUND) -> None:
        if bound < 1:
            raise ValueError("inbox bound must be at least 1")
        self._bound = bound
        self._items: deque[tuple[int, list[Any]]] = deque()
        self._wakeup = anyio.Event()
        self._overflowed = False
        self._closed: BaseException | None = None

    @property
    def overflowed(self) -> bool:
        return self._overflowed

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, seq: int, ops: list[Any]) -> bool:
        """Queue a batch; never blocks. Returns False (and marks overflow) when full."""
        if self._overflowed or self._closed is not None:
            return False
        if len(self._items) >= self._bound:
            # Everything queued is useless now: the stream has a gap after it.
            self._items.clear()
            self._overflowed = True
            self._wakeup.set()
            return False
        self._items.append((seq, ops))
        self._wakeup.set()
        return True

    def close(self, exc: BaseException) -> None:
        if self._closed is None:
            self._closed = exc
            self._wakeup.set()

    def get_nowait(self) -> tuple[int, list[Any]] | None:
        """The next batch, or None when there is none yet; raises like ``get``."""
        if self._items:
            return self._items.popleft()
        if self._overflowed:
            raise InboxOverflow("subscription fell behind; stream batches were dropped")
        if self._closed is not None:
            raise self._closed
        return None

    async def get(self) -> tuple[int, list[Any]]:
        while True:
            item = self.get_nowait()
            if item is not None:
                return item
            self._wakeup = anyio.Event()
            await self._wakeup.wait()


class FollowInbox:
    """Queue of one follower's ``output`` notification params (raw JSON), fed by the reader.

    Lossless: ``put_nowait`` always queues; ``full`` tells the reader to wait (``wait_room``)
    before it reads on. A closed inbox takes nothing and never makes the reader wait."""

    def __init__(self, budget: int = FOLLOW_INBOX_BYTES) -> None:
        self._budget = budget
        self._items: deque[bytes] = deque()
        self._bytes = 0
        self._wakeup = anyio.Event()  # the consumer waits for items
        self._room = anyio.Event()  # the reader waits for room
        self._closed: BaseException | None = None
        self._ended = False  # the consumer closed it

    @property
    def full(self) -> bool:
        return not self._ended and self._bytes >= self._budget

    def put_nowait(self, params: bytes) -> None:
        if self._ended or self._closed is not None:
            return
        self._items.append(params)
        self._bytes += len(params)
        self._wakeup.set()

    async def wait_room(self) -> None:
        while self.full:
            self._room = anyio.Event()
            await self._room.wait()

    def close(self, exc: BaseException) -> None:
        """The connection ended: the consumer gets ``exc`` once the queue is empty."""
        if self._closed is None:
            self._closed = exc
            self._wakeup.set()

    def end(self) -> None:
        """The consumer is done: drop what is queued, never hold the reader again."""
        self._ended = True
        self._items.clear()
        self._bytes = 0
        self._room.set()
        self._wakeup.set()

    async def get(self) -> bytes:
        """The next params (raw JSON); raises the connection's end once all were taken."""
        while True:
            if self._items:
                item = self._items.popleft()
                self._bytes -= len(item)
                if self._bytes < self._budget:
                    self._room.set()
                return item
            if self._ended:
                raise anyio.ClosedResourceError("the follower was closed")
            if self._closed is not None:
                raise self._closed
            self._wakeup = anyio.Event()
            await self._wakeup.wait()


class _FollowId(msgspec.Struct):
    followId: str


_follow_id_decoder = msgspec.json.Decoder(_FollowId)


class _Waiter:
    __slots__ = ("done", "result", "error", "on_result", "result_type")

    def __init__(self, on_result: Callable[[Any], None] | None, result_type: Any) -> None:
        self.done = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.on_result = on_result
        self.result_type = result_type


class Connection:
    """One JSON-RPC connection. Build it with ``open_connection``; use ``call``."""

    def __init__(self, stream: anyio.abc.ByteStream, *,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._stream = stream
        self._max_line = max_line_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, _Waiter] = {}
        self._inboxes: dict[str, Inbox] = {}
        self._follows: dict[str, FollowInbox] = {}
        self._send_in, self._send_out = anyio.create_memory_object_stream[bytes](_SEND_QUEUE)
        self._closed: BaseException | None = None
        self._orphan_error: RpcError | None = None

    # -- public --------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def call(
        self,
        method: str,
        params: Any = None,
        *,
        result_type: Any = Any,
        on_result: Callable[[Any], None] | None = None,
    ) -> Any:
        """Send a request and return its ``result``; raise ``RpcError`` for an ``error``.

        The result is decoded into ``result_type`` (plain JSON by default; a result that does
        not fit raises ``msgspec.ValidationError``). ``on_result`` runs in the reader task as
        the response arrives, before any later line is looked at; if it raises, the call
        raises that instead of returning.
        """
        if self._closed is not None:
            raise self._closed
        request_id = next(self._ids)
        waiter = _Waiter(on_result, result_type)
        self._pending[request_id] = waiter
        try:
            line = encode_request(request_id, method, {} if params is None else params)
            try:
                await self._send_in.send(line)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise self._closed or ConnectionLost("connection to dshd is closed") from None
            await waiter.done.wait()
        finally:
            self._pending.pop(request_id, None)
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def register_inbox(self, subscription_id: str, inbox: Inbox) -> None:
        """Route ``stream`` notifications of ``subscription_id`` to ``inbox``."""
        if self._closed is not None:
            inbox.close(self._closed)
        self._inboxes[subscription_id] = inbox

    def drop_inbox(self, subscription_id: str) -> None:
        """Stop routing; later batches of that subscription are dropped."""
        self._inboxes.pop(subscription_id, None)

    def register_follow(self, follow_id: str, inbox: FollowInbox) -> None:
        """Route ``output`` notifications of ``follow_id`` to ``inbox`` (lossless)."""
        if self._closed is not None:
            inbox.close(self._closed)
        self._follows[follow_id] = inbox

    def drop_follow(self, follow_id: str) -> None:
        """Stop routing (and never wait for that inbox again)."""
        inbox = self._follows.pop(follow_id, None)
        if inbox is not None:
            inbox.end()

    def statistics(self) -> dict[str, int]:
        return {"pending": len(self._pending), "inboxes": len(self._inboxes),
                "follows": len(self._follows)}

    # -- tasks ---------------------------------------------------------------------------
    async def _writer(self) -> None:
        try:
            async with self._send_out:
                async for line in self._send_out:
                    await self._stream.send(line)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._close(_lost(exc))

    async def _reader(self) -> None:
        lines = LineBuffer(self._max_line)
        try:
            while True:
                try:
                    data = await self._stream.receive(_READ_CHUNK)
                except anyio.EndOfStream:
                    self._close(ConnectionLost("dshd closed the connection"))
                    return
                lines.feed(data)
                self._take_lines(lines)
                for inbox in [i for i in self._follows.values() if i.full]:
                    await inbox.wait_room()  # lossless: pause the socket, not drop
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._close(_lost(exc))
        except (_BadMessage, _LineTooLong) as exc:
            self._close(ConnectionLost(str(exc)))

    def _take_lines(self, lines: LineBuffer) -> None:
        """Dispatch every complete line fed so far. The client's oversize policy: a daemon
        that breaks the client's limit is broken, so the connection ends at once -- the moment
        the buffer starts discarding, without waiting for the line's newline."""
        while True:
            event = lines.next_event()
            if event is NEED_DATA:
                if lines.discarding:
                    raise _LineTooLong(f"dshd sent a line over {self._max_line} bytes")
                return
            if isinstance(event, Oversize):
                raise _LineTooLong(f"dshd sent a line over {self._max_line} bytes")
            assert isinstance(event, (bytes, bytearray))  # no budget: never OverBudget
            self._dispatch(event)

    # -- reader internals ----------------------------------------------------------------
    def _dispatch(self, line: bytes | bytearray) -> None:
        for msg in parse_message(line):
            if isinstance(msg, Notification):
                self._notification(msg)
            elif isinstance(msg, (Response, ErrorResponse)):
                self._response(msg)
            elif isinstance(msg, RpcError):
                raise _BadMessage(f"dshd sent an invalid message: {msg.message}")
            # A Request from the daemon: none is defined in v1; ignore it.

    def _notification(self, msg: Notification) -> None:
        if msg.method == "output":
            self._output(msg)
            return
        if msg.method != "stream":
            return  # a notification this client does not know: ignore (forward compatible)
        try:
            params = decode_params(msg.params, StreamParams)
        except RpcError as exc:
            raise _BadMessage(f"dshd sent an invalid stream notification: {exc.message}") from None
        inbox = self._inboxes.get(params.subscription_id)
        if inbox is not None:
            inbox.put_nowait(params.seq, params.ops)

    def _output(self, msg: Notification) -> None:
        raw = bytes(msg.params) if msg.params is not None else b""
        try:
            follow_id = _follow_id_decoder.decode(raw).followId
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise _BadMessage("dshd sent an output notification without a followId") from None
        inbox = self._follows.get(follow_id)
        if inbox is not None:
            inbox.put_nowait(raw)

    def _response(self, msg: Response | ErrorResponse) -> None:
        if msg.id is None:
            if isinstance(msg, ErrorResponse):
                self._orphan_error = RpcError(msg.error.code, msg.error.message, msg.error.data)
            return
        waiter = self._pending.get(msg.id) if isinstance(msg.id, int) else None
        if waiter is None:
            return  # its caller was cancelled; nothing waits for it any more
        if isinstance(msg, ErrorResponse):
            waiter.error = RpcError(msg.error.code, msg.error.message, msg.error.data)
        else:
            try:
                waiter.result = msgspec.json.decode(msg.result, type=waiter.result_type)
                if waiter.on_result is not None:
                    waiter.on_result(waiter.result)
            except Exception as exc:  # noqa: BLE001 - handed to the caller, not lost
                waiter.error = exc
        waiter.done.set()

    def _close(self, exc: BaseException) -> None:
        if self._closed is not None:
            return
        if self._orphan_error is not None:
            exc = self._orphan_error
        self._closed = exc
        for waiter in self._pending.values():
            if not waiter.done.is_set():
                waiter.error = exc
                waiter.done.set()
        for inbox in self._inboxes.values():
            inbox.close(exc)
        for follow in self._follows.values():
            follow.close(exc)
        self._send_in.close()


@asynccontextmanager
async def open_connection(
    stream: anyio.abc.ByteStream, *, max_line_bytes: int = MAX_LINE_BYTES
) -> AsyncIterator[Connection]:
    """Run a ``Connection`` over ``stream`` for the duration of the block, then close it.

    An exception raised in the block comes out as itself, not wrapped in an exception group.
    """
    conn = Connection(stream, max_line_bytes=max_line_bytes)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(conn._reader)
            tasks.start_soon(conn._writer)
            try:
                yield conn
            finally:
                conn._close(ConnectionLost("connection closed by the client"))
                tasks.cancel_scope.cancel()
                with anyio.move_on_after(1, shield=True):
                    await stream.aclose()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
