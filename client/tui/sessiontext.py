"""The session pane's texts: its recent results and the turn, and the short status words.

Theory of operation: plain functions of lane values (PROTOCOL.md §3.3) to rich ``Text``; every
string from dshd goes through ``client.tui.ansi`` (``visible_line``, ``visible_text``).
:func:`status_word` is a result's status in a few letters (``exit N``, or a word for its
error code, EXEC.md), shared by the recent list and the sessions pane's last exit.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from client.tui.ansi import visible_line, visible_text

__all__ = ["RECENT_SHOWN", "STATUS_WORDS", "status_word", "exit_word", "recent_text",
           "turn_text"]

#: Recent results listed in the session pane, as rows allow (the lane keeps ≤ 20).
RECENT_SHOWN = 20
#: Short words for the error codes (EXEC.md), so a narrow column stays readable.
STATUS_WORDS = {"APPROVAL_REJECTED": "rejected", "APPROVAL_CANCELLED": "cancelled",
                "APPROVAL_UNAVAILABLE": "no answer", "TOOL_CANCELLED": "cancelled",
                "TOOL_FAILED": "failed", "TOOL_NOT_STARTED": "not started",
                "TOOL_OUTCOME_UNKNOWN": "unknown", "TOOL_TIMEOUT": "timed out"}


def status_word(entry: dict[str, Any]) -> str:
    """A result's status in a few letters: ``exit N``, or a word for its error code."""
    code = entry.get("errorCode")
    if code:
        return STATUS_WORDS.get(str(code), str(code).lower().replace("_", " "))
    return f"exit {entry.get('exitCode')}"


def exit_word(last: Any) -> str:
    """A session's last exit (an exit code, or an error code: its word)."""
    if isinstance(last, str) and last and not last.lstrip("-").isdigit():
        return STATUS_WORDS.get(last, last.lower().replace("_", " "))
    return str(last)


def recent_text(recent: list[dict[str, Any]], commands: dict[str, str] | None = None) -> Text:
    """The last results, one line each: the status first (always seen), then the command
    (else the tool's name and call id), cut at the pane's edge."""
    text = Text("recent: ", style="bold", no_wrap=True, overflow="ellipsis")
    if not recent:
        return text.append("none", style="dim")
    for entry in recent[:RECENT_SHOWN]:
        command = (commands or {}).get(str(entry.get("callId")))
        style = "red" if entry.get("isError") else "green"
        text.append("\n  ")
        text.append(f"{visible_line(status_word(entry)):<10}", style=style)
        text.append(visible_line(command if command
                                 else f"{entry.get('name')} {entry.get('callId')}"))
    return text


def turn_text(turn: dict[str, Any] | None) -> Text:
    if not turn:
        return Text("no turn running (ctrl+t: chat mode, or type '> text')", style="dim")
    text = Text(visible_line(f"turn {turn.get('turnId')} · {turn.get('state')} · step "
                             f"{turn.get('step')}") + "\n", style="bold")
    text.append(visible_text(str(turn.get("text") or "")))
    for call in turn.get("calls") or []:
        text.append("\n  → " + visible_line(f"{call.get('name')} {call.get('callId')} "
                                            f"{call.get('state')}"), style="dim")
    return text
