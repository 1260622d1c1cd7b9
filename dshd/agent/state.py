"""The turn loop's state: one running turn, one proposed call, and the text rules they share.

Theory of operation: :class:`Turn` is everything the loop (``dshd.agent.turn``) knows of the
running turn besides the log: its step, its cancel scopes, the calls it waits for, the steers
queued for the next step boundary, and how it is ending (cancelled, stopping, closing,
detached by a daemon stop). :class:`Proposed` is a model's call the loop will try to start.
:func:`clean` and :func:`json_value` say what text and values may be recorded. No I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import trio

from protocol.errors import OpError
from protocol.ops import check_json_value


def clean(text: str) -> str:
    """``text`` safe for the log and the lane: lone surrogates become U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def json_value(value) -> bool:
    """True when ``value`` may be recorded (OPS.md §1: ints within ±(2^53-1), finite floats)."""
    try:
        check_json_value(value)
    except OpError:
        return False
    return True


@dataclass
class Turn:
    """The running turn (module doc)."""

    id: str
    #: Seconds its calls wait for an answerer (``turn.start``'s ``askTimeout``; None: the
    #: daemon's ``turn_ask_grace_seconds``; PROTOCOL.md §3.4).
    ask_grace: float | None = None
    #: turn.cancel (or the session's stop) came: the loop unwinds at its next boundary.
    cancelled: bool = False
    steers: deque[str] = field(default_factory=deque)
    step_id: str | None = None
    steps: int = 0
    #: Cancel scope of the current step's barriers and model request (cancelled by cancel).
    scope: trio.CancelScope | None = None
    #: Calls of the current step that were started and have not settled.
    running: set[str] = field(default_factory=set)
    #: Proposed calls (callId -> tool name) not started nor settled yet (settled at the end).
    unstarted: dict[str, str] = field(default_factory=dict)
    #: The daemon is stopping: the turn ends ``interrupted`` rather than ``cancelled``.
    stopping: bool = False
    #: The loop has decided how the turn ends: steers are refused from here on.
    closing: bool = False
    #: A daemon stop detached the turn (``dshd.agent.turn``): it ends without a record.
    detached: bool = False
    #: Cancel scope of the turn's whole task (a detaching stop cancels it).
    task_scope: trio.CancelScope | None = None


@dataclass
class Proposed:
    """A model's call the loop will try to start: its minted id, name and parsed arguments."""

    call_id: str
    name: str
    raw_name: str
    arguments: dict
    concurrent: bool
