"""One client connection: a reader that dispatches, one writer task with a bounded queue.

Theory of operation (PROTOCOL.md §1–§2):

* The reader splits the byte stream into lines. A line longer than ``max_message_bytes`` is
  discarded through its newline and answered ``-32600`` (``id: null``); invalid JSON gets
  ``-32700``; the connection stays open after both.
* ``initialize`` is handled in line (it must come first; anything else before it gets
  ``-32002``). Every other request runs as its own task in the connection's handler nursery, so
  a ``tool.wait`` never holds up the requests behind it; at most ``max_requests_per_connection``
  run at once (more get ``-32013``).
* One writer task drains one FIFO send queue. Responses are never dropped: when the bytes of
  queued responses pass their bound, the connection is closed. Stream batches have their own
  byte budget; a batch that does not fit is dropped for its subscription, which waits for a base
  batch that the writer triggers once the queue has drained (``Publisher.rebase``). A peer that
  does not read for ``stalled_client_seconds`` is closed with a logged reason.
* Closing the connection ends its subscriptions; the sessions' tool calls keep running.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import structlog
import trio

from protocol import rpc

from .handlers import dispatch

if TYPE_CHECKING:
    from .server import Daemon
    from .sessions.streams import Subscription

log = structlog.get_logger("dshd.connection")

_next_conn_id = 0


class Connection:
    def __init__(self, daemon: "Daemon", stream: trio.SocketStream, uid: int | None) -> None:
        global _next_conn_id
        _next_conn_id += 1
        self.id = _next_conn_id
        self.daemon = daemon
        self.config = daemon.config
        self.stream = stream
        self.uid = uid
        self.initialized = False
        self.client: dict = {}
        self.capabilities: dict = {}
        self.subscriptions: dict[str, "Subscription"] = {}
        self._queue: deque[tuple[bytes, "Subscription | None"]] = deque()
        self._stream_bytes = 0
        self._response_bytes = 0
        self._wakeup = trio.Event()
        self._resync: dict[str, "Subscription"] = {}
        self._in_flight = 0
        self._closing = False
        self._nursery: trio.Nursery | None = None
        self.log = log.bind(conn=self.id, uid=uid)

    # ------------------------------------------------------------------ sending
    def _push(self, line: bytes, sub: "Subscription | None") -> None:
        self._queue.append((line, sub))
        self._wakeup.set()

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
                        session = self.daemon.registry.open.get(sub.session_id)
                        if session is not None and sub.id in self.subscriptions:
                            session.publisher.rebase(sub)
                    continue
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            line, sub = self._queue.popleft()
            with trio.move_on_after(stalled) as scope:
                try:
                    await self.stream.send_all(line)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.close("the client went away")
                    return
            if sub is None:
                self._response_bytes -= len(line)
            else:
                self._stream_bytes -= len(line)
            if scope.cancelled_caught:
                self.close(f"the client did not read for {stalled:g} s")
                return

    # ------------------------------------------------------------------ receiving
    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                if not self.daemon.peer_allowed(self.uid):
                    self.send_line(
                        rpc.encode_error(None, rpc.PERMISSION_DENIED,
                                         "permission denied: this daemon serves its own user "
                                         "(and, in system mode, the configured group)")
                    )
                    await self._drain_then_close()
                    self.log.warning("connection.refused", reason="peer uid not allowed")
                    nursery.cancel_scope.cancel()
                    return
                try:
                    await self._reader(nursery)
                finally:
                    # EOF or error: finish in-flight requests' responses briefly, then stop.
                    nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away: nothing to answer
        finally:
            for sub in list(self.subscriptions.values()):
                session = self.daemon.registry.open.get(sub.session_id)
                if session is not None:
                    session.unsubscribe(sub)
            self.subscriptions.clear()
            with trio.move_on_after(1) as cs:
                cs.shield = True
                await self.stream.aclose()

    async def _drain_then_close(self) -> None:
        """Give the writer a bounded moment to send what is queued (the refusal line)."""
        with trio.move_on_after(2):
            while self._queue:
                await trio.sleep(0.01)

    async def _reader(self, nursery: trio.Nursery) -> None:
        limit = self.config.max_message_bytes
        buf = bytearray()
        discarding = False
        while True:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            start = 0
            while True:
                nl = data.find(b"\n", start)
                if nl < 0:
                    if not discarding:
                        buf += data[start:]
                        if len(buf) > limit:
                            buf.clear()
                            discarding = True
                    break
                if discarding:
                    discarding = False
                    self._oversize(limit)
                else:
                    buf += data[start:nl]
                    if len(buf) > limit:
                        self._oversize(limit)
                    elif buf.strip():
                        await self._on_line(bytes(buf), nursery)
                    buf.clear()
                start = nl + 1

    def _oversize(self, limit: int) -> None:
        self.send_line(
            rpc.encode_error(
                None, rpc.INVALID_REQUEST,
                f"message longer than max_message_bytes ({limit} bytes); it was discarded",
            )
        )

    async def _on_line(self, line: bytes, nursery: trio.Nursery) -> None:
        try:
            parsed = rpc.parse_message(line)
        except rpc.RpcError as exc:
            self.send_line(rpc.encode_error(None, exc.code, exc.message, exc.data))
            return
        if parsed.is_batch:
            if not self._admit(None):
                return
            nursery.start_soon(self._run_batch, parsed.items)
            return
        item = parsed.items[0]
        if isinstance(item, rpc.Request) and item.method == "initialize":
            response = await dispatch(self, item)
            if response is not None:
                self.send_line(response)
            return
        if not self._admit(item):
            return
        nursery.start_soon(self._run_one, item)

    def _admit(self, item) -> bool:
        if self._in_flight >= self.config.max_requests_per_connection:
            rid = getattr(item, "id", None)
            self.send_line(
                rpc.encode_error(rid, rpc.LIMIT_EXCEEDED,
                                 f"too many requests in flight on this connection "
                                 f"(max {self.config.max_requests_per_connection}); wait for answers")
            )
            return False
        self._in_flight += 1
        return True

    async def _run_one(self, item) -> None:
        try:
            response = await dispatch(self, item)
            if response is not None:
                self.send_line(response)
        finally:
            self._in_flight -= 1

    async def _run_batch(self, items: list) -> None:
        try:
            responses: list[bytes | None] = [None] * len(items)

            async def one(i: int, item) -> None:
                responses[i] = await dispatch(self, item)

            async with trio.open_nursery() as n:
                for i, item in enumerate(items):
                    n.start_soon(one, i, item)
            parts = [r.rstrip(b"\n") for r in responses if r is not None]
            if parts:
                self.send_line(b"[" + b",".join(parts) + b"]\n")
        finally:
            self._in_flight -= 1
