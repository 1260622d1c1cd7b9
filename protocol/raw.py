"""The raw channel's params, results and notification (PROTOCOL.md §3.2, HOST.md §6).

Theory of operation: a call's output is bytes at absolute offsets; ``bytes`` fields are base64
strings on the wire (msgspec's encoding), and their caps count decoded bytes. ``tool.read`` and
``tool.follow`` read it (``output`` is the follower's notification), ``tool.write``,
``tool.closeStdin``, ``tool.resize`` and ``tool.signal`` reach the running command. The
structs refuse hostile values before a handler runs: offsets ≥ 0, a read ``limit`` ≤ 4 MiB, a
write ≤ 1 MiB decoded, 1..10,000 columns and rows, a signal from :data:`Signal`. What needs
the call (its range, its stdin) is the daemon's check. Their entries are in
``protocol.methods.METHODS``. Pure: msgspec and ``protocol`` only.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .structs import _Params, _Result

__all__ = [
    "MAX_OUTPUT_CHUNK_BYTES", "MAX_READ_BYTES", "MAX_TERMINAL_CELLS", "MAX_WRITE_BYTES",
    "OutputGap", "OutputParams", "Signal", "ToolCallParams", "ToolFollowParams",
    "ToolFollowResult", "ToolReadParams", "ToolReadResult", "ToolResizeParams",
    "ToolSignalParams", "ToolUnfollowParams", "ToolWriteParams", "ToolWriteResult",
]

#: ``tool.read``'s default and largest ``limit``, bytes (HOST.md §6).
MAX_READ_BYTES = 4 * 1024 * 1024
#: ``tool.write``'s largest ``data``, bytes after base64 decoding (the host's own cap).
MAX_WRITE_BYTES = 1024 * 1024
#: The bytes of one ``output`` notification's ``data`` at most (a follower's chunk).
MAX_OUTPUT_CHUNK_BYTES = 256 * 1024
#: ``tool.resize``'s range of ``cols`` and ``rows``.
MAX_TERMINAL_CELLS = 10_000
#: The signals ``tool.signal`` sends, by name without ``SIG`` (HOST.md §4).
Signal = Literal["INT", "TERM", "HUP", "QUIT", "KILL", "USR1", "USR2", "WINCH", "CONT",
                 "STOP", "TSTP"]
Offset = Annotated[int, Meta(ge=0)]
TerminalCells = Annotated[int, Meta(ge=1, le=MAX_TERMINAL_CELLS)]


class ToolReadParams(_Params):
    """``tool.read``: up to ``limit`` raw bytes of the call's output from absolute ``offset``
    (``limit`` ≤ 4 MiB, the default). An offset outside [firstOffset, endOffset] is the
    daemon's ``-32602`` (it names the bound in ``data``)."""

    session_id: str
    call_id: str
    offset: Offset
    limit: Annotated[int, Meta(ge=0, le=MAX_READ_BYTES)] = MAX_READ_BYTES


class ToolReadResult(_Result):
    """``data`` (base64 on the wire) starts at ``offset``; ``[firstOffset, endOffset)`` is what
    the call dir retains now; ``eof``: the call ended and ``data`` reaches ``endOffset``."""

    offset: int
    data: bytes
    first_offset: int
    end_offset: int
    eof: bool


class ToolFollowParams(_Params):
    """``tool.follow``: ``output`` notifications of the call's raw bytes from ``offset`` on."""

    session_id: str
    call_id: str
    offset: Offset = 0


class ToolFollowResult(_Result):
    follow_id: str


class ToolUnfollowParams(_Params):
    follow_id: str


class ToolWriteParams(_Params):
    """``tool.write``: ``data`` (base64 on the wire, ≤ 1 MiB decoded) to the call's stdin."""

    session_id: str
    call_id: str
    data: Annotated[bytes, Meta(max_length=MAX_WRITE_BYTES)]


class ToolWriteResult(_Result):
    written: int


class ToolCallParams(_Params):
    """``tool.closeStdin``: a call of a session, nothing else."""

    session_id: str
    call_id: str


class ToolResizeParams(_Params):
    """``tool.resize``: the call's terminal to ``cols`` × ``rows`` (1..10,000 each)."""

    session_id: str
    call_id: str
    cols: TerminalCells
    rows: TerminalCells


class ToolSignalParams(_Params):
    """``tool.signal``: ``signal`` (a name of :data:`Signal`) to the command's processes."""

    session_id: str
    call_id: str
    signal: Signal


class OutputGap(_Result):
    """Bytes ``[from, to)`` were dropped by the per-call disk cap before this follower read
    them; it goes on at ``to`` (the call's firstOffset then)."""

    from_: int = msgspec.field(name="from")
    to: int


class OutputParams(_Result, omit_defaults=True):
    """The ``output`` notification of a follower (``tool.follow``), one of three shapes:
    bytes ``{followId, offset, data}`` (``data`` ≤ 256 KiB decoded), a gap
    ``{followId, gap: {from, to}}``, and the last one ``{followId, offset, eof: true,
    exitCode?}`` (``exitCode`` when the command's status is known), or, when the daemon
    cannot read the log, ``{followId, offset, error}`` (follow again from ``offset``)."""

    follow_id: str
    offset: int | UnsetType = UNSET
    data: bytes | UnsetType = UNSET
    gap: OutputGap | UnsetType = UNSET
    eof: bool = False
    exit_code: int | None | UnsetType = UNSET
    error: str | UnsetType = UNSET
