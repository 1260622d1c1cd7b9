"""What following one call shares between its tasks and its end (``client.cli.stream`` and
``client.cli.conclude``): the call, how dsh talks to it, the events the tasks report through
one channel, and what was printed (``OutputState``) and learnt (``Followed``) -- kept across
the connections of a daemon restart, so that following goes on from the byte printed
through. Plain data, and ``say``: one stderr line that reads right in raw mode too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable

from anyio.streams.memory import MemoryObjectSendStream

from client.api import Client
from client.cli.localterm import write_line
from client.cli.termmodes import TermModes
from client.cli.terminal import note
from protocol.lane import ToolResult

__all__ = ["Call", "Io", "Detach", "Cancelling", "Waits", "OutputDone", "Result", "Event",
           "Events", "Extra", "OutputState", "Followed", "say"]


@dataclass(frozen=True)
class Call:
    session_id: str
    call_id: str


@dataclass(frozen=True)
class Io:
    """How dsh talks to the call (``KEYS_RULE``)."""

    tty: bool = False  # the call runs under a PTY
    raw: bool = False  # the local stdin is a terminal, put in raw mode
    forward: bool = False  # stdin (not a terminal) is copied to the command's stdin
    detach_keys: bytes = b""
    cancel_on_interrupt: bool = False


# ---------------------------------------------------------------------- events
@dataclass(frozen=True)
class Detach:
    why: str  # "interrupt" | "pipe" | "keys" | "signal"
    signum: int = 0


@dataclass(frozen=True)
class Cancelling:
    pass


@dataclass(frozen=True)
class Waits:
    approval_id: str | None


@dataclass(frozen=True)
class OutputDone:
    error: str | None = None  # the follow was refused: why


@dataclass(frozen=True)
class Result:
    result: ToolResult


Event = Detach | Cancelling | Waits | OutputDone | Result
Events = MemoryObjectSendStream[Event]
#: A task of the caller's that runs beside the others on each connection (``dsh run --ask``).
Extra = Callable[[Client, Events], Awaitable[None]]


@dataclass
class OutputState:
    """What ``_output`` printed (read by ``_decide`` and ``conclude``)."""

    position: int = 0
    dropped: int = 0  # bytes the disk cap dropped before they were printed
    gaps: int = 0
    progress_at: float = 0.0
    result_known: bool = False
    raw_mode: bool = False
    line_open: bool = False  # the output printed last did not end its line (``say``)
    error: str | None = None
    input_done: bool = False  # stdin reached its end and tool.closeStdin was answered
    input_in_flight: int = 0  # bytes of a tool.write not answered yet
    #: What the output did to the local terminal while raw (undone on leaving: ``termmodes``).
    modes: TermModes = field(default_factory=TermModes)


@dataclass
class Followed:
    """How following ended: the result (None when detached first) and what we knew."""

    result: ToolResult | None
    detached: Detach | None = None
    waiting: str | None = None
    cancelling: bool = False
    output: OutputState = field(default_factory=OutputState)


def say(state: OutputState, text: str) -> None:
    """One line on stderr (``\\r\\n`` while the terminal is raw; there it starts on a line of
    its own, after a ``\\r\\n``, when the output printed last left its line open: a prompt,
    a full-screen program's cursor)."""
    if state.raw_mode:
        write_line(("\r\n" if state.line_open else "") + text)
        state.line_open = False
    else:
        note(text)
