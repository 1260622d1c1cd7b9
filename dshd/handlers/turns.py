"""Turns of the agent loop (PROTOCOL.md §3.5): turn.start, turn.cancel, turn.steer.

Theory of operation: a turn is the agent's (``dshd.agent.TurnDriver``); these handlers check
the input (non-blank; its cap is the params struct's) and the session, and hand the text on.
One turn runs at a time (``-32013`` TURN_RUNNING); a steer without a running turn is
``-32602`` NO_TURN.
"""

from __future__ import annotations

from protocol import methods as m

from ..errors import InvalidParams
from . import port
from .context import ConnectionPort

__all__ = ["turn_cancel", "turn_start", "turn_steer"]


def _non_blank(text: str) -> None:
    if not text.strip():
        raise InvalidParams("input must be a non-empty string", field="input")


async def turn_start(conn: ConnectionPort, p: m.TurnStartParams) -> m.TurnStartResult:
    _non_blank(p.input)
    session = await port.open_session(conn, p.session_id)
    return m.TurnStartResult(turn_id=port.start_turn(session, p.session_id, p.input,
                                                     p.ask_timeout))


async def turn_cancel(conn: ConnectionPort, p: m.TurnCancelParams) -> m.CancelledResult:
    session = await port.open_session(conn, p.session_id)
    return m.CancelledResult(cancelled=port.cancel_turn(session))


async def turn_steer(conn: ConnectionPort, p: m.TurnSteerParams) -> m.TurnSteerResult:
    _non_blank(p.input)
    session = await port.open_session(conn, p.session_id)
    return m.TurnSteerResult(turn_id=port.steer_turn(session, p.session_id, p.input))
