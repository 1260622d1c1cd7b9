"""Agent turns across a daemon restart (issue 13 item 5; HOST.md §7, STORAGE.md §5).

Theory of operation: when a session is opened after a daemon stop, its resume plan
(``dshd.sessions.resume.plan_resume``) asks :func:`resumable_turns` which open turns can go
on: a turn whose open step was waiting only for tool calls that have a result or are being
resumed (re-adopted, settled from their host's exit record, or re-asked). Repair leaves those
turns and their open step unclosed; once the calls are back the session calls
:func:`resume_turn` for each, which continues the turn loop from the log.

STUB (room adopt): no turn is resumable yet and :func:`resume_turn` does nothing, so every
open turn is ended ``interrupted`` by repair exactly as before issue 13. Room asks replaces
both bodies.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from typing import Any


def resumable_turns(events: Iterable[Any], resumed_call_ids: Set[str]) -> set[str]:
    """The turnIds of the open turns that resume after the start (stub: none)."""
    return set()


async def resume_turn(port: Any, events: Iterable[Any], turn_id: str) -> None:
    """Continue turn ``turn_id`` from the log (stub: nothing; repair ended no such turn)."""
    return None
