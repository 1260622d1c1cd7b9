"""A client-side mirror of one streamed view (OPS.md §2–§4), pure and synchronous.

Theory of operation: a subscription delivers batches ``(seq, wire_ops)``. The mirror decodes
each batch with its own codec ``Decoder`` and applies it with ``protocol.apply`` to a plain
JSON value it owns. A base batch (first op ``r``) starts over: a fresh decoder, a fresh value.
Anything that makes the mirror suspect -- a non-base batch before any base, a seq that is not
the previous one plus one, a decode error, an apply error -- resets the mirror to empty and
raises ``MirrorBroken``; the caller subscribes again and the next base batch heals it.

No I/O, no event loop: the async side (``client.subscription``) owns the socket and the retries.
"""

from __future__ import annotations

from typing import Any

from protocol.apply import apply, is_base
from protocol.codec import Decoder

__all__ = ["Mirror", "MirrorBroken"]


class MirrorBroken(Exception):
    """The mirror cannot follow the stream any more; subscribe again for a base batch."""

    def __init__(self, reason: str, *, seq: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.seq = seq


class Mirror:
    """Holds the value of one view and follows its batches.

    ``value`` is ``None`` until the first base batch; ``seq`` is the seq of the last batch
    applied (``None`` before any); ``last_ops`` are the decoded ops of that batch (tuples in
    the ``Op`` form), for callers that want to see *how* the value changed, not only what it is.
    """

    def __init__(self) -> None:
        self._decoder: Decoder | None = None
        self._value: Any = None
        self._seq: int | None = None
        self._last_ops: list[Any] = []

    @property
    def value(self) -> Any:
        return self._value

    @property
    def seq(self) -> int | None:
        return self._seq

    @property
    def ready(self) -> bool:
        """True once a base batch has been applied (and no error since)."""
        return self._seq is not None

    @property
    def last_ops(self) -> list[Any]:
        return self._last_ops

    def reset(self) -> None:
        """Forget everything; the next batch must be a base batch."""
        self._decoder = None
        self._value = None
        self._seq = None
        self._last_ops = []

    def feed(self, seq: int, wire_ops: list[Any]) -> None:
        """Apply one batch. Raises ``MirrorBroken`` (and resets) when it cannot."""
        try:
            base = bool(wire_ops) and is_base(wire_ops)
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            self.reset()
            raise MirrorBroken(f"malformed batch: {exc}", seq=seq) from exc
        if base:
            decoder = Decoder()
            value: Any = None
        else:
            if self._seq is None or self._decoder is None:
                self.reset()
                raise MirrorBroken("delta batch before any base batch", seq=seq)
            if seq != self._seq + 1:
                expected = self._seq + 1
                self.reset()
                raise MirrorBroken(f"seq gap: expected {expected}, got {seq}", seq=seq)
            decoder = self._decoder
            value = self._value
        try:
            ops = decoder.decode(wire_ops)
            value = apply(value, ops)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            # OpError is a ValueError; the others cover wire shapes the codec did not expect.
            kind = getattr(exc, "kind", None)
            self.reset()
            detail = f"{kind}: {exc}" if kind else str(exc)
            raise MirrorBroken(f"batch {seq} failed: {detail}", seq=seq) from exc
        self._decoder = decoder
        self._value = value
        self._seq = seq
        self._last_ops = list(ops)
