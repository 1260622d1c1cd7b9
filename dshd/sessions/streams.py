"""Lane publication: one paced publisher per session, one encoder per subscription.

Theory of operation (PROTOCOL.md §3.3, OPS.md §4–§5, EXEC.md §2):

* The lane view of a session lives in a ``protocol.Tracker``. Producers change it in two ways,
  and tell the publisher which: *bulk* changes (a running call's output, which the publisher
  copies from its ``OutputCapture`` right before a paced publish, and the running turn's
  streaming text) call :meth:`Publisher.mark_dirty`; *control* changes (a call entering,
  starting or leaving the lane, an approval shown or hidden, settings, the turn's state) call
  :meth:`Publisher.mark_changed`. Nothing is sent at that moment.
* The publisher task wakes on either. Control changes go out at once, whatever the pacing
  says: the tracker is flushed without copying any output, so the batch holds what the lane's
  writers changed (small by kind: a call's entry carries at most ``LANE_ARGS_BYTES`` of its
  arguments). Bulk changes wait for the pacing of EXEC.md §2: the first after idle at once,
  then at most one paced publish per ``interval`` (less ``PACE_GRACE``), and not before the
  byte pause has ended. The byte pause is charged in *encoded wire bytes*: each publish's
  size is the longest notification line it offered to a subscription (what that subscriber's
  send budget really takes; no subscriber, no bytes), and a batch of more than
  ``SMALL_BATCH_BYTES`` adds ``size / rate`` seconds to the pause, counted from the later of
  its end and the end of the pause before it. A paced publish copies every changed capture
  into the tracker, flushes it to one Op batch and hands it to every subscription, so a flood
  of tiny writes costs O(publishes), never O(writes), and a turnover flood is held to
  ``rate`` wire bytes per second per subscriber.
* :meth:`Publisher.publish_control` is the same "at once" path for a writer that needs its
  change seen now (a settling call's final output, then its leaving; a turn beginning);
  :meth:`Publisher.publish_now` also copies every output first (a new subscription, a rebase,
  the session's final state).
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
#: A batch of at most this many encoded wire bytes adds no byte pause (EXEC.md §2).
SMALL_BATCH_BYTES = 4096


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

    def _offer(self, ops: list) -> int:
        """Encode and queue one batch; returns the line's bytes (queued or dropped)."""
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
            return len(line)
        self.dropped_batches += 1
        self.needs_base = True
        self.sink.want_resync(self)
        return len(line)

    def deliver(self, ops: list) -> int:
        """Send one delta batch (Op form), unless this subscription waits for a base; returns
        the encoded line's bytes (0: nothing was encoded)."""
        if self.closed or self.needs_base or not ops:
            return 0
        return self._offer(ops)

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
        rate: float = 2 * 1024 * 1024,
        small_bytes: int = SMALL_BATCH_BYTES,
    ) -> None:
        self.tracker = tracker
        self.subscriptions: dict[str, Subscription] = {}
        self._before_flush = before_flush
        self._interval = interval
        self._rate = rate
        self._small = small_bytes
        self._wake = trio.Event()
        self._bulk = False  # output to copy, or turn text: waits for the pacing
        self._control = False  # a lane writer's change: goes at once
        self._paced_at = -math.inf  # earliest start of the next paced publish (interval)
        self._bytes_at = -math.inf  # end of the byte pause
        #: Publishes with a batch, of them the ones at once (control), and their wire bytes
        #: (the longest line of each); paced publishes that waited for the byte pause.
        self.publishes = 0
        self.control_publishes = 0
        self.bytes_published = 0
        self.byte_pauses = 0

    def mark_dirty(self) -> None:
        """A bulk change (output, turn text): published at the next paced publish."""
        self._bulk = True
        self._wake.set()

    def mark_changed(self) -> None:
        """A control change (module doc): published at once, whatever the byte pause says."""
        self._control = True
        self._wake.set()

    def statistics(self) -> dict:
        return {"publishes": self.publishes, "controlPublishes": self.control_publishes,
                "bytesPublished": self.bytes_published, "bytePauses": self.byte_pauses}

    def _publish(self, *, pull: bool) -> int:
        """Flush (after copying every output when ``pull``) and fan out; charge the byte
        pause; returns the batch's wire size (its longest line)."""
        if pull:
            self._before_flush()
            self._bulk = False
        self._control = False
        ops = self.tracker.flush()
        if not ops:
            return 0
        size = 0
        for sub in list(self.subscriptions.values()):
            size = max(size, sub.deliver(ops))
        self.publishes += 1
        self.control_publishes += not pull
        self.bytes_published += size
        if size > self._small:
            self._bytes_at = max(self._bytes_at, trio.current_time()) + size / self._rate
        return size

    def publish_now(self) -> int:
        """Copy every output and publish now; returns the batch's wire size in bytes."""
        return self._publish(pull=True)

    def publish_control(self) -> int:
        """Publish what the lane's writers changed now, copying no output (module doc)."""
        return self._publish(pull=False)

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
        while True:
            if not (self._control or self._bulk):
                await self._wake.wait()
            self._wake = trio.Event()
            if self._control:
                self.publish_control()
            if not self._bulk:
                continue
            at = max(self._paced_at, self._bytes_at)
            if trio.current_time() < at:
                self.byte_pauses += at == self._bytes_at
                with trio.move_on_at(at):
                    await self._wake.wait()  # a control change meanwhile goes at once
                continue
            start = trio.current_time()
            self._publish(pull=True)
            # The interval runs from the start of a publish (its own work does not push the
            # next one back) less PACE_GRACE (a timed wake-up comes up to ~1 ms late: epoll
            # rounds up to whole ms); the byte pause from its end (``_publish``). Without the
            # grace, a source at exactly 1/interval drifts by each late wake-up into a 0-10 ms
            # sawtooth.
            self._paced_at = start + self._interval - PACE_GRACE
