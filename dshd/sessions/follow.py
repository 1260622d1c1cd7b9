"""The raw channel's reading side: a call's output at absolute offsets, and lossless followers.

Theory of operation (HOST.md §3, §6). Every byte a call's command writes is in its call dir
(``<session>/calls/<callId>/output.raw`` and its segments), written by the call host; the daemon
never holds a call's output in memory. This module reads it back for clients:

* :class:`CallSource` is one call as a reader sees it: the session's ``call_output`` port (the
  call dir, the ``HostHandle`` while the host runs, the recorded result once settled) and the
  host's reader ``dshd.callhost.log`` (``scan``: the retained range; ``read``: bytes at an
  offset, ``Gap`` when they were dropped meanwhile), every file access in a worker thread.
  :meth:`CallSource.state` decides "ended" *before* it scans the files: the host writes and
  fsyncs the log before the exit record, so a scan after an ended call saw is final. A settled
  call is read from disk alone, also after it left memory or the daemon restarted.
* ``tool.read`` is one :meth:`CallSource.state` and one :meth:`CallSource.read`.
* A :class:`Follower` (``tool.follow``) is a task of its connection that walks the log from
  its offset: it reserves room on the connection's send path for one line *before* it reads
  the bytes (``FollowSink.reserve_follow``: it waits while the connection's queued follower
  lines fill their budget, so a slow reader pauses it and nothing is dropped), reads at most
  :data:`CHUNK_BYTES`, queues one ``output`` notification and goes on. Its memory is one
  chunk. At the end of the log it waits on ``HostHandle.wait_progress`` (the host's coalesced
  progress events); a call that has no host yet (at its approval gate or checkpoint) is looked
  at again every :data:`NO_HOST_POLL_SECONDS` (so is one whose host connection ended before
  its exit record came, until the call settles). An offset before the call's ``firstOffset`` (the
  per-call disk cap dropped those bytes, before or while it read) is one ``gap {from, to}``
  notification and the follower goes on at ``to``. The last notification is ``{offset, eof:
  true, exitCode?}``; a log the daemon cannot read ends the follower with ``{offset, error}``
  instead (never an ``eof`` that would claim completeness).
* A follower ends with its last notification, with ``tool.unfollow`` (its cancel scope), and
  with its connection (it runs in the connection's handler nursery, which a close or a
  graceful stop cancels).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import structlog
import trio

from protocol import methods as m
from protocol import rpc

from ..callhost import log as calllog
from ..callhost.log import Gap
from ..storage import threads

__all__ = ["CHUNK_BYTES", "CallSource", "FollowSink", "Follower", "Gap", "OutputState",
           "line_bound", "output_line"]

log = structlog.get_logger("dshd.follow")

#: Bytes of one ``output`` notification's data at most (HOST.md §6).
CHUNK_BYTES = m.MAX_OUTPUT_CHUNK_BYTES
#: Seconds between two looks at a call that has no host yet (its gate or its checkpoint).
NO_HOST_POLL_SECONDS = 0.1
#: A line's bytes beyond its base64 data at most: the envelope, the followId, the offset.
LINE_OVERHEAD_BYTES = 256


def line_bound(nbytes: int) -> int:
    """The encoded size of an ``output`` line carrying ``nbytes`` of data, at most."""
    return 4 * ((nbytes + 2) // 3) + LINE_OVERHEAD_BYTES


def output_line(params: m.OutputParams) -> bytes:
    return rpc.encode_notification("output", params)


@dataclass(frozen=True)
class OutputState:
    """What a call's dir retains now: ``[first_offset, end_offset)``; ``ended``: the command's
    exit is recorded (the range is final); ``exit_code`` once known."""

    first_offset: int
    end_offset: int
    segment_bytes: int
    ended: bool
    exit_code: int | None


def _scan(call_dir: Path) -> Any:
    """``dshd.callhost.log.scan``, or None while the call dir has no log (never started)."""
    try:
        return calllog.scan(call_dir)
    except FileNotFoundError:  # the call dir appeared but holds no log yet
        return None


def _exit_record(call_dir: Path) -> dict | None:
    try:
        with open(call_dir / "exit.json", "rb") as f:
            record = json.loads(f.read(1024 * 1024))
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None



class CallSource:
    """One call of one session, as a reader of its output sees it (module doc).

    ``lookup`` answers the session's ``call_output(call_id)`` now (a follower outlives the
    request that made it: the host appears, the call settles)."""

    def __init__(self, call_id: str, lookup: Callable[[], Any]) -> None:
        self.call_id = call_id
        self._lookup = lookup
        self._record: dict | None = None  # the exit record read from disk, once ended

    def output(self) -> Any:
        """The session's ``call_output`` now: ``(dir, host, result)``."""
        return self._lookup()

    async def state(self) -> OutputState:
        out = self._lookup()
        record = out.host.record if out.host is not None else None
        ended = record is not None or out.result is not None
        ext = await threads.run_sync(_scan, out.dir)  # after "ended": final when ended
        if ended and record is None:
            if self._record is None:
                self._record = await threads.run_sync(_exit_record, out.dir)
            record = self._record
        exit_code = (record or {}).get("exitCode")
        if exit_code is None and record is None and out.result is not None:
            exit_code = out.result.get("exitCode")
        if ext is None:
            return OutputState(0, 0, 0, ended, exit_code)
        return OutputState(ext.first_offset, ext.end_offset, ext.segment_bytes, ended, exit_code)

    async def read(self, state: OutputState, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes at ``offset`` (within ``state``'s range); :class:`Gap` when
        the host dropped them since ``state`` was taken."""
        limit = min(limit, state.end_offset - offset)
        if limit <= 0:
            return b""
        return await threads.run_sync(calllog.read, self._lookup().dir, offset, limit,
                                      state.segment_bytes)

    async def wait_change(self, offset: int) -> None:
        """Return once the log may have grown past ``offset`` or the call may have ended."""
        out = self._lookup()
        host = out.host
        if host is not None and host.record is None and not getattr(host, "closed", False):
            await host.wait_progress(offset)
        elif out.result is None and (host is None or host.record is None):
            # No host yet, or its connection ended before the record came: the call settles
            # (or its host appears) soon; look again.
            await trio.sleep(NO_HOST_POLL_SECONDS)
        else:
            await trio.lowlevel.checkpoint()


class FollowSink(Protocol):
    """What a follower needs of its connection (``dshd.connection.Connection``)."""

    async def reserve_follow(self, nbytes: int) -> None: ...

    def send_follow(self, line: bytes, reserved: int) -> None: ...

    def release_follow(self, reserved: int) -> None: ...


class Follower:
    """One ``tool.follow``: ``output`` notifications of one call's bytes from ``offset``."""

    def __init__(self, follow_id: str, source: CallSource, offset: int, sink: FollowSink,
                 on_end: Callable[["Follower"], None]) -> None:
        self.id = follow_id
        self.source = source
        self.offset = offset
        self.sink = sink
        self._on_end = on_end
        self._scope = trio.CancelScope()

    def cancel(self) -> None:
        """``tool.unfollow``: nothing more is sent."""
        self._scope.cancel()

    async def run(self) -> None:
        try:
            with self._scope:
                try:
                    await self._pump()
                except OSError as exc:
                    log.error("follow.read_failed", follow=self.id, call=self.source.call_id,
                              offset=self.offset, error=str(exc))
                    await self._send(m.OutputParams(
                        follow_id=self.id, offset=self.offset,
                        error=f"dshd cannot read this call's output at offset {self.offset}: "
                              f"{exc.strerror or exc}; follow again from this offset"))
        finally:
            self._on_end(self)

    async def _pump(self) -> None:
        while True:
            state = await self.source.state()
            if self.offset < state.first_offset:
                await self._gap(state.first_offset)
            elif self.offset < state.end_offset:
                await self._chunk(state)
            elif state.ended:
                await self._send(m.OutputParams(
                    follow_id=self.id, offset=self.offset, eof=True,
                    exit_code=state.exit_code if state.exit_code is not None else m.UNSET))
                return
            else:
                await self.source.wait_change(self.offset)

    async def _chunk(self, state: OutputState) -> None:
        size = min(CHUNK_BYTES, state.end_offset - self.offset)
        reserved = line_bound(size)
        await self.sink.reserve_follow(reserved)
        try:
            data = await self.source.read(state, self.offset, size)
        except Gap as gap:
            self.sink.release_follow(reserved)
            await self._gap(gap.first_offset)
            return
        except BaseException:
            self.sink.release_follow(reserved)
            raise
        if not data:
            self.sink.release_follow(reserved)
            await trio.lowlevel.checkpoint()
            return
        self.sink.send_follow(
            output_line(m.OutputParams(follow_id=self.id, offset=self.offset, data=data)),
            reserved)
        self.offset += len(data)

    async def _gap(self, first_offset: int) -> None:
        await self._send(m.OutputParams(
            follow_id=self.id, gap=m.OutputGap(from_=self.offset, to=first_offset)))
        self.offset = first_offset

    async def _send(self, params: m.OutputParams) -> None:
        line = output_line(params)
        await self.sink.reserve_follow(len(line))
        self.sink.send_follow(line, len(line))


