"""Lane publication: one paced publisher per session, one encoder per subscription.

Theory of operation (PROTOCOL.md §3.3, OPS.md §4–§5, EXEC.md §2):

* The lane view of a session lives in a ``protocol.Tracker``. Producers (the session's call
  tasks) change it, or change an ``OutputCapture`` that the publisher copies into it, and then
  call :meth:`Publisher.mark_dirty`. Nothing is sent at that moment.
* The publisher task wakes on dirty, respects the pacing of EXEC.md §2 (the first update after
  idle at once; then at most one publish per ``interval`` seconds, and after each publish a pause
  of its encoded size at ``rate`` bytes/s), pulls every changed capture into the tracker, flushes
  the tracker to one Op batch and hands it to every subscription. A flood of tiny writes thus
  costs O(publishes), never O(writes).
* Each :class:`Subscription` owns its ``Encoder`` and its ``seq``. It encodes the batch and puts
  the finished line on its connection's send queue; when the queue refuses (a slow reader), the
  subscription is marked *needs base*, drops everything until the connection drains, then gets a
  fresh base batch with the next seq (``rebase``).
* A new subscription first forces a publish (so every existing subscriber is at the current
  state), then gets ``["r", view]``: the base and every later delta agree.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Protocol

import msgspec
import trio

from protocol.codec import Encoder

if TYPE_CHECKING:
    from protocol.tracker import Tracker

_json = msgspec.json.Encoder()
#: Seconds a paced publish may come before its interval is over (timer granularity).
PACE_GRACE = 0.002


class StreamSink(Protocol):
    """What a subscription needs from its connection (``dshd.connection.Connection``)."""

    def offer_stream(self, line: bytes, subscription: "Subscription") -> bool:
        """Queue one notification line; False when the stream budget is full (dropped)."""

    def want_resync(self, subscription: "Subscription") -> None:
        """Ask to be called back (``Subscription.rebase``) once the queue has drained."""


class Subscription:
    """One client's mirror of one session's lane: an encoder, a seq counter and a sink."""

    def __init__(self, subscription_id: str, session_id: str, sink: StreamSink) -> None:
        self.id = subscription_id
        self.session_id = session_id
        self.sink = sink
        self.seq = 0
        self.needs_base = True
        self.closed = False
        self.dropped_batches = 0
        self._encoder = Encoder()

    def end(self) -> None:
        """The subscriber ended it (unsubscribe, or its connection closed): nothing more is
        sent, and no session re-attaches it (a crashed session's revival skips it)."""
        self.closed = True

    def _offer(self, ops: list) -> bool:
        wire = self._encoder.encode(ops)
        line = _json.encode(
            {
                "jsonrpc": "2.0",
                "method": "stream",
                "params": {"subscriptionId": self.id, "seq": self.seq, "ops": wire},
            }
        ) + b"\n"
        if self.sink.offer_stream(line, self):
            self.seq += 1
            return True
        self.dropped_batches += 1
        self.needs_base = True
        self.sink.want_resync(self)
        return False

    def deliver(self, ops: list) -> None:
        """Send one delta batch (Op form), unless this subscription waits for a base."""
        if self.closed or self.needs_base or not ops:
            return
        self._offer(ops)

    def send_base(self, view: object) -> None:
        """Send ``[["r", view]]`` with the next seq; a fresh table (the ``r`` resets it)."""
        if self.closed:
            return
        self._encoder = Encoder()
        self.needs_base = False
        self._offer([["r", view]])


class Publisher:
    """The session's one publisher: pacing + tracker flush + fan-out (EXEC.md §2)."""

    def __init__(
        self,
        tracker: "Tracker",
        *,
        before_flush: Callable[[], None],
        interval: float = 0.010,
        rate: float = 256 * 1024,
    ) -> None:
        self.tracker = tracker
        self.subscriptions: dict[str, Subscription] = {}
        self._before_flush = before_flush
        self._interval = interval
        self._rate = rate
        self._dirty = trio.Event()
        self.publishes = 0
        self.bytes_published = 0

    def mark_dirty(self) -> None:
        self._dirty.set()

    def publish_now(self) -> int:
        """Flush pending changes to every subscription now; returns the batch size in bytes."""
        self._before_flush()
        ops = self.tracker.flush()
        if not ops:
            return 0
        size = len(_json.encode(ops))
        self.publishes += 1
        self.bytes_published += size
        for sub in list(self.subscriptions.values()):
            sub.deliver(ops)
        return size

    def attach(self, sub: Subscription) -> None:
        """Add a subscription and send it its base batch (after a publish, see module doc)."""
        self.publish_now()
        self.subscriptions[sub.id] = sub
        sub.send_base(self.tracker.value)

    def rebase(self, sub: Subscription) -> None:
        """Resync a subscription that was dropped to *needs base*."""
        if sub.closed or sub.id not in self.subscriptions:
            return
        self.publish_now()
        sub.send_base(self.tracker.value)

    def detach(self, sub: Subscription) -> None:
        sub.end()
        self.subscriptions.pop(sub.id, None)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        next_allowed = -math.inf
        while True:
            await self._dirty.wait()
            now = trio.current_time()
            if now < next_allowed:
                await trio.sleep_until(next_allowed)
            self._dirty = trio.Event()
            start = trio.current_time()
            size = self.publish_now()
            done = trio.current_time()
            # The interval runs from the start of a publish (its own work does not push the
            # next one back) less PACE_GRACE (a timed wake-up comes up to ~1 ms late: epoll
            # rounds up to whole ms); the size pause runs from its end. Without both, a source
            # at exactly 1/interval drifts by each late wake-up into a 0-10 ms sawtooth.
            next_allowed = max(start + self._interval - PACE_GRACE, done + size / self._rate)
