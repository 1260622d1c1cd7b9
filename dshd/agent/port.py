"""What the agent loop may do to its session: the port ``dshd.agent.turn`` talks to.

Theory of operation: the turn loop never reaches into a session (its log, lane tracker,
publisher or nursery). It records events, waits for durability (its checkpoint barriers go
through :meth:`SessionPort.wait_durable`), reads the history (awaited: it comes from disk), changes the lane's ``turn``
value through :class:`TurnLane`, starts its own task with ``spawn``, and drives tool calls
through the same verbs a client's request uses (``start_call``, ``wait_result``,
``cancel_call``) plus the two a model's call needs: ``propose_call`` (a recorded answer names
the call: waitable from then on) and ``settle_unstarted`` (a call refused before its
``tool/call``). ``dshd.sessions.session.Session`` implements it; the tests drive the loop with
a fake.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol

from protocol.lane import TurnCall, TurnView

from ..config import Config


class TurnLane(Protocol):
    """The lane's ``turn`` value (``dshd.sessions.lane.Lane``)."""

    def begin_turn(self, view: TurnView) -> None:
        """A turn begins (published at once)."""
        ...

    def set_turn(self, view: TurnView | None) -> None: ...

    def update_turn(self, key: str, value: Any) -> None: ...

    def turn_calls(self, calls: list[TurnCall]) -> None:
        """The current step's calls; their states then follow the calls (module doc of
        ``dshd.sessions.lane``)."""
        ...

    def turn_text(self, text: str, *, append: bool = False) -> None: ...


class SessionPort(Protocol):
    """The session as the agent loop sees it (module doc)."""

    id: str
    config: Config
    #: The session's agent slot (``TurnDriver.of`` fills it).
    agent: Any

    @property
    def cwd(self) -> str: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def turn_lane(self) -> TurnLane: ...

    def record(self, type_: str, data: dict) -> int:
        """Append an event; its seq (buffered until made durable)."""
        ...

    async def wait_durable(self, seq: int) -> None: ...

    async def history(self) -> list:
        """The session's conversation events, oldest first (``agent.history.build_messages``
        reads them), read from the log on disk and its tail; StorageError (``LogCorrupt``)
        when a frame read is damaged."""
        ...

    def accepting(self) -> bool:
        """New work is accepted (False while the session closes)."""
        ...

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: object) -> None: ...

    def deadline(self) -> float:
        """The trio time by which a stopping session's work must have wound down."""
        ...

    def has_call(self, call_id: str) -> bool: ...

    def propose_call(self, call_id: str, name: str) -> None: ...

    def start_call(self, call_id: str, name: str, arguments: dict, approved: bool, *,
                   turn_id: str | None = None, step_id: str | None = None,
                   ask_timeout: float | None = None) -> None: ...

    def settle_unstarted(self, call_id: str, name: str, code: str, text: str) -> dict: ...

    async def wait_result(self, call_id: str, timeout: float | None) -> dict | None: ...

    def cancel_call(self, call_id: str) -> bool: ...
