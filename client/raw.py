"""A call's raw output channel (HOST.md §6, PROTOCOL.md §3.2): bytes at absolute offsets.

Theory of operation: the call host writes every byte the command wrote to the call's log;
the daemon serves it by absolute offset. ``tool.read`` answers one range (``ReadResult``);
``tool.follow`` streams ``output`` notifications from an offset to the end. ``OutputFollow``
is one follow: it registers a lossless ``client.transport.FollowInbox`` for its ``followId``
from inside the reader (the ``on_result`` hook, as a subscription does), so the first
notification, which may follow the response at once, is never missed; iterating it yields
``Chunk`` (bytes at an offset), ``Gap`` (the per-call disk cap dropped ``from``..``to``: the
stream goes on at ``to``) and, last, ``End`` (the call ended and every byte was sent; its exit
code when the daemon knows it) or ``Broken`` (the daemon could not read the log at an offset:
follow again from there). Each chunk is checked to start where the last one ended: a
stream with a hole the daemon did not call a gap is ``BadAnswer``, never silently printed.
``aclose`` sends ``tool.unfollow`` (bounded, best effort) and stops the routing.

``tail_offset`` finds where the last N lines start, reading backwards from the end with
``tool.read`` (``dsh attach --tail``, like ``tail -n``/``docker logs --tail``: a last line
without its newline counts as a line). Pure protocol: no terminal, no printing.
"""

from __future__ import annotations

from typing import Any, Protocol

import anyio
import msgspec

from client.transport import Connection, ConnectionLost, DshClientError, FollowInbox
from protocol import methods as m
from protocol.rpc import RpcError


class Client(Protocol):
    """What the raw channel needs of ``client.api.Client`` (named here: no import cycle)."""

    @property
    def connection(self) -> Connection: ...

    async def request(self, method: str, params: msgspec.Struct | None = None, *,
                      on_result: Any = None) -> Any: ...

    async def read_output(self, session_id: str, call_id: str, offset: int,
                          limit: int | None = None, *, from_first: bool = False) -> Any: ...

__all__ = ["ReadResult", "Chunk", "Gap", "End", "Broken", "RawAnswerError", "OutputFollow", "tail_offset", "READ_LIMIT",
           "TAIL_READ"]

#: The most ``tool.read`` answers at once (HOST.md §6).
READ_LIMIT = 4 * 1024 * 1024
#: How much ``tail_offset`` reads per step backwards.
TAIL_READ = 256 * 1024


class RawAnswerError(DshClientError):
    """dshd's raw channel said something that does not add up (a hole, a bad offset)."""


#: ``tool.read``'s answer: ``data`` (decoded) starts at ``offset``.
ReadResult = m.ToolReadResult


_output_decoder = msgspec.json.Decoder(m.OutputParams)


def _given(value: Any) -> Any:
    return None if value is msgspec.UNSET else value


class Chunk(msgspec.Struct, frozen=True):
    offset: int
    data: bytes


class Gap(msgspec.Struct, frozen=True):
    start: int
    to: int


class End(msgspec.Struct, frozen=True):
    offset: int
    exit_code: int | None = None


class Broken(msgspec.Struct, frozen=True):
    """The daemon could not read the log at ``offset``: follow again from there."""

    offset: int
    message: str


class _FollowResult(msgspec.Struct, frozen=True, rename="camel"):
    follow_id: str


class OutputFollow:
    """One ``tool.follow``: ``async for item in follow`` yields ``Chunk``/``Gap``, then ``End``."""

    def __init__(self, client: Client, session_id: str, call_id: str, offset: int) -> None:
        self._client = client
        self.session_id = session_id
        self.call_id = call_id
        #: The offset of the next byte expected.
        self.position = offset
        self.follow_id: str | None = None
        self._inbox = FollowInbox()
        self._done = False

    async def open(self) -> "OutputFollow":
        conn = self._client.connection

        def register(result: m.ToolFollowResult) -> None:
            conn.register_follow(result.follow_id, self._inbox)

        result = await self._client.request("tool.follow", m.ToolFollowParams(
            session_id=self.session_id, call_id=self.call_id, offset=self.position),
            on_result=register)
        self.follow_id = result.follow_id
        return self

    def __aiter__(self) -> "OutputFollow":
        return self

    async def __anext__(self) -> Chunk | Gap | End | Broken:
        if self._done:
            raise StopAsyncIteration
        raw = await self._inbox.get()
        try:
            item = _output_decoder.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise RawAnswerError(f"dshd sent an output notification this client cannot "
                                 f"read: {exc}") from None
        return self._checked(item)

    def _checked(self, item: m.OutputParams) -> Chunk | Gap | End | Broken:
        gap_range, offset = _given(item.gap), _given(item.offset)
        if gap_range is not None:
            if gap_range.to < self.position:
                raise RawAnswerError(f"dshd sent a gap to {gap_range.to}, before the offset "
                                     f"already printed ({self.position})")
            gap = Gap(max(gap_range.from_, self.position), gap_range.to)
            self.position = gap_range.to
            return gap
        if _given(item.error) is not None:
            self._done = True
            return Broken(self.position if offset is None else offset, item.error)
        if offset != self.position:
            raise RawAnswerError(f"dshd's output jumped from offset {self.position} to "
                                 f"{offset} without a gap")
        if item.eof:
            self._done = True
            return End(offset, _given(item.exit_code))
        data = _given(item.data) or b""
        self.position += len(data)
        return Chunk(item.offset, data)

    async def aclose(self) -> None:
        """Stop following (``tool.unfollow``, best effort and bounded)."""
        follow_id, self.follow_id = self.follow_id, None
        if follow_id is None:
            return
        conn = self._client.connection
        conn.drop_follow(follow_id)
        if self._done or conn.closed:
            return
        with anyio.move_on_after(2, shield=True):
            try:
                await self._client.request("tool.unfollow",
                                           m.ToolUnfollowParams(follow_id=follow_id))
            except (RpcError, ConnectionLost):
                pass  # gone already (the call ended, or the connection did)

    async def __aenter__(self) -> "OutputFollow":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


async def _read_exact(client: Client, session_id: str, call_id: str, start: int,
                      stop: int) -> bytes:
    """The retained bytes [start, stop) (``tool.read`` may answer fewer than asked)."""
    parts: list[bytes] = []
    position = start
    while position < stop:
        piece = await client.read_output(session_id, call_id, position,
                                         min(stop - position, READ_LIMIT))
        if not piece.data:
            raise RawAnswerError(f"tool.read at {position} answered no bytes before the "
                                 f"end offset {stop}")
        parts.append(piece.data)
        position += len(piece.data)
    return b"".join(parts)


async def tail_offset(client: Client, session_id: str, call_id: str,
                      lines: int) -> tuple[int, int]:
    """(the offset where the last ``lines`` lines of the retained output start, firstOffset).

    A final newline ends the last line; a last line without one is a line all the same."""
    probe = await client.read_output(session_id, call_id, 0, 1, from_first=True)
    first, end = probe.first_offset, probe.end_offset
    if lines <= 0 or end <= first:
        return end, first
    last = await _read_exact(client, session_id, call_id, end - 1, end)
    position = end - 1 if last == b"\n" else end
    remaining = lines
    while position > first:
        start = max(first, position - TAIL_READ)
        data = await _read_exact(client, session_id, call_id, start, position)
        index = len(data)
        while True:
            at = data.rfind(b"\n", 0, index)
            if at < 0:
                break
            remaining -= 1
            if remaining == 0:
                return start + at + 1, first
            index = at
        position = start
    return first, first
