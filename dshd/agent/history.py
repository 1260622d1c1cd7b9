"""The conversation a model sees, built from the session log (issue 5 §3). Pure: no I/O.

Theory of operation: the log is the only memory. :func:`build_messages` walks the events once
and produces chat-completions messages: the system prompt, then every ``message/user`` and
``message/assistant`` of every turn in log order. Right after an assistant message that
proposed tool calls come one ``tool`` message per call, in the order proposed, wherever the
``tool/result`` sits in the log: the API wants them there, and this is what guarantees that
no request ever carries a call without a result.

A call's result is its ``tool/result`` — the real one, or the synthetic one repair wrote after
a crash (``TOOL_OUTCOME_UNKNOWN``, ``TOOL_NOT_STARTED``): the model reads the code and the
sentence and decides whether to retry. A call with no result at all (only possible for a log
that was never repaired) gets the sentence repair would have written.

Frontend calls (``tool.run`` outside a turn) are not part of the conversation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..storage.repair import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT


def default_system_prompt(cwd: str) -> str:
    return (
        "You are an agent hosted by dshd. You act through one tool, `bash`, which runs a "
        f"shell command in the session's working directory ({cwd}) inside a sandbox, and "
        "only after a person approves the call. Every result tells you how the call ended: "
        "an exit code, or an errorCode with a sentence (for instance TOOL_OUTCOME_UNKNOWN "
        "after a crash: the command may or may not have run, so check before repeating "
        "anything that is not read-only). Keep commands short and non-interactive, and "
        "answer in plain text when you are done."
    )


def result_text(result: dict | None, *, called: bool) -> str:
    """The ``tool`` message content for one call: its output, then a bracketed trailer."""
    if result is None:
        code = "TOOL_OUTCOME_UNKNOWN" if called else "TOOL_NOT_STARTED"
        sentence = OUTCOME_UNKNOWN_TEXT if called else NOT_STARTED_TEXT
        return f"{sentence}\n[errorCode: {code}]"
    content = result.get("content")
    content = content if isinstance(content, str) else ""
    details = result.get("details") if isinstance(result.get("details"), dict) else {}
    trailer: list[str] = []
    code = result.get("errorCode")
    if isinstance(code, str):
        trailer.append(f"errorCode: {code}")
    message = result.get("message")
    if isinstance(message, str) and message:
        trailer.append(message)
    exit_code = result.get("exitCode", details.get("exitCode"))
    if isinstance(exit_code, int):
        trailer.append(f"exit code: {exit_code}")
    truncation = details.get("truncation")
    if isinstance(truncation, dict) and truncation.get("truncated"):
        note = (
            f"output truncated by {truncation.get('truncatedBy')}: kept the last "
            f"{truncation.get('maxLines')} lines / {truncation.get('maxBytes')} bytes of "
            f"{truncation.get('totalLines')} lines / {truncation.get('totalBytes')} bytes"
        )
        spill = details.get("spillPath")
        if isinstance(spill, str):
            note += f"; the full output is in {spill}"
        trailer.append(note)
    if not content and not trailer:
        return "(no output)"
    body = content if content else "(no output)"
    if not trailer:
        return body
    sep = "" if body.endswith("\n") else "\n"
    return f"{body}{sep}[{'; '.join(trailer)}]"


def build_messages(events: Iterable[Any], system_prompt: str) -> list[dict]:
    """Chat messages for the next request (module doc). ``events``: ``Event``-like objects
    with ``type`` and ``data``, oldest first."""
    events = list(events)
    results: dict[str, dict] = {}
    called: set[str] = set()
    for ev in events:
        cid = ev.data.get("callId") if isinstance(ev.data, dict) else None
        if not isinstance(cid, str):
            continue
        if ev.type == "tool/result":
            results[cid] = ev.data
        elif ev.type == "tool/call":
            called.add(cid)
    messages: list[dict] = [{"role": "system", "content": system_prompt}]
    for ev in events:
        data = ev.data
        if ev.type == "message/user":
            messages.append({"role": "user", "content": str(data.get("text", ""))})
        elif ev.type == "message/assistant":
            text = str(data.get("text") or "")
            calls = [c for c in data.get("toolCalls") or [] if isinstance(c, dict)
                     and isinstance(c.get("callId"), str)]
            message: dict = {"role": "assistant", "content": text if (text or not calls) else None}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c["callId"],
                        "type": "function",
                        "function": {"name": str(c.get("name", "")),
                                     "arguments": str(c.get("arguments", "{}"))},
                    }
                    for c in calls
                ]
            messages.append(message)
            for c in calls:
                cid = c["callId"]
                messages.append(
                    {"role": "tool", "tool_call_id": cid,
                     "content": result_text(results.get(cid), called=cid in called)}
                )
    return messages


def assistant_count(messages: list[dict]) -> int:
    """How many assistant messages a request carries (the scripted provider's position)."""
    return sum(1 for m in messages if m.get("role") == "assistant")
