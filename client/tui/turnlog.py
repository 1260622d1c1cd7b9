"""What the lane does not keep, read back from the session's log (``session.events``).

Theory of operation: the lane view is a bounded, live picture (PROTOCOL.md §3.3): it drops a
turn -- with its last step's text -- when the turn ends, and its ``recent`` results carry no
arguments. The TUI reads what it then lacks from the log, bounded: the last
``WINDOW_EVENTS`` events only (one page), newest match wins, in a worker of the app's loop,
never on the UI's own time. :func:`final_text` is an ended turn's last ``message/assistant``
text; :func:`call_commands` maps call ids to the command of their ``tool/call``.
:func:`raw_tail` is not the log but the call's raw output (``tool.read``, HOST.md §6): the
end of an ended call's bytes as the program wrote them, carriage returns and all (a result's
``content`` drops them, EXEC.md §2, so a progress bar's states ran together there).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["final_text", "call_commands", "raw_tail", "WINDOW_EVENTS", "RAW_TAIL_BYTES"]

#: The most events read back from the end of the log for one look-up.
WINDOW_EVENTS = 500
#: The most raw bytes read back from the end of a call's output (one ``tool.read``).
RAW_TAIL_BYTES = 64 * 1024


async def raw_tail(client: Any, session_id: str, call_id: str,
                   limit: int = RAW_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a call's raw output, decoded, from a line's start (the
    line cut by the read's start is dropped)."""
    probe = await client.read_output(session_id, call_id, 0, 1, from_first=True)
    start = max(probe.first_offset, probe.end_offset - limit)
    if start >= probe.end_offset:
        return ""
    piece = await client.read_output(session_id, call_id, start, probe.end_offset - start)
    text = bytes(piece.data).decode("utf-8", "replace")
    if piece.offset > probe.first_offset and "\n" in text:
        text = text.split("\n", 1)[1]
    return text


async def _tail_events(client: Any, session_id: str) -> list[dict[str, Any]]:
    head = await client.events(session_id, limit=0)
    page = await client.events(session_id, max(-1, head.last_seq - WINDOW_EVENTS),
                               WINDOW_EVENTS)
    return [json.loads(bytes(raw)) for raw in page.events]


async def final_text(client: Any, session_id: str, turn_id: str) -> str | None:
    """The text of turn ``turn_id``'s last ``message/assistant`` (None: not in the window)."""
    found = None
    for event in await _tail_events(client, session_id):
        data = event.get("data") or {}
        if event.get("type") == "message/assistant" and data.get("turnId") == turn_id:
            found = str(data.get("text") or "")
    return found


def _arguments(raw: Any) -> Any:
    """A ``tool/call``'s arguments (a JSON string in the log)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw or {}


async def call_commands(client: Any, session_id: str, call_ids: set[str]) -> dict[str, str]:
    """``{callId: command}`` of the ``tool/call`` events of ``call_ids`` in the window."""
    commands: dict[str, str] = {}
    for event in await _tail_events(client, session_id):
        data = event.get("data") or {}
        if event.get("type") == "tool/call" and data.get("callId") in call_ids:
            args = _arguments(data.get("arguments"))
            command = args.get("command") if isinstance(args, dict) else None
            commands[data["callId"]] = str(command if command is not None
                                           else f"{data.get('name', '?')} {args}")
    return commands
