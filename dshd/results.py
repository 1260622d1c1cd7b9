"""The one table of the sentences a person reads when a call ends early.

Theory of operation: a ToolResult (PROTOCOL.md §3.2; its shape is ``protocol.lane.ToolResult``)
that ends early carries an ``errorCode`` and a sentence from :data:`SENTENCES`, one entry per
errorCode (and per variant where one code has several causes), through :func:`sentence`. When
the command never started, ``content`` is the sentence; when it started, ``content`` is its
output and ``message`` the sentence. Results are built in one place,
``dshd.sessions.calls``; the rooms that end a call early raise :class:`CallFailed` with their
code and sentence instead: the approval gate (``dshd.sessions.approval``), the checkpoint
barrier (``dshd.sessions.barrier``) and the turn loop (``dshd.agent.turn``: model calls refused
before a ``tool/call``: unknown tool, invalid arguments, limits, cancelled turn). The crash
repair's sentences (TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN) are defined by
``dshd.storage.repair`` and listed here so that the table is complete.

Pure: no I/O, no trio.
"""

from __future__ import annotations

from typing import Any

from .storage.repair import NOT_GRANTED_TEXT, NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT

__all__ = ["SENTENCES", "CallFailed", "sentence"]

#: errorCode -> variant -> sentence template (``str.format`` fields in braces). The variant
#: ``""`` is the code's usual cause. EXEC.md §1 carries this table.
SENTENCES: dict[str, dict[str, str]] = {
    "APPROVAL_REJECTED": {
        "policy": "the session's approval policy is 'never', so the call was rejected and did "
        "not run. Change it with `dsh policy SESSION ask`, or run the command yourself with "
        "`dsh run`.",
        "answerer": "the call was rejected by the person approving it and did not run.",
        "audit": "the approval could not be recorded in the session log, so the call was "
        "rejected and did not run (no unrecorded grants).",
    },
    "APPROVAL_UNAVAILABLE": {
        "": "nobody was attached to approve this call, so it did not run. Keep an answerer "
        "attached (`dsh attach --approve --follow SESSION`) and retry, or submit it "
        "pre-approved (`dsh run`).",
        "left": "the last attached answerer left before deciding, so the call did not run. "
        "Keep an answerer attached (`dsh attach --approve --follow SESSION`) and retry.",
        "grace": "dshd restarted while this call waited for approval, and nobody attached to "
        "approve it within reask_grace_seconds after the start, so it did not run. Keep an "
        "answerer attached (`dsh attach --approve --follow SESSION`) and retry.",
        "turn": "nobody was attached to approve this call of the turn within "
        "turn_ask_grace_seconds (the chat left or was never attached), so it did not run. "
        "Re-join the turn sooner (`dsh chat --attach SESSION`) or answer it "
        "(`dsh approvals`, then `dsh approve APPROVAL`).",
        "timeout": "nobody decided this call or attached to approve it within its askTimeout "
        "(`dsh run --ask-timeout`), so it did not run. Answer sooner (`dsh approvals`, then "
        "`dsh approve APPROVAL`) or give a longer --ask-timeout, and retry.",
    },
    "APPROVAL_CANCELLED": {
        "": "the call was cancelled while it waited for approval; it did not run.",
    },
    "ABORTED_BEFORE_DISPATCH": {
        "": "cancelled before it started; {what} did not run",
        "stopping": "the daemon stopped before the call started; nothing ran",
        "could-not-start": "dshd could not start this call ({error}); nothing ran",
        "crashed-before": "the session crashed ({error}) before the call started; nothing ran",
        "turn": "the turn was cancelled before this call started; the command did not run",
    },
    "STORAGE_FAILURE": {
        "": "the session log could not be made durable ({error}), so nothing was started. "
        "Free disk space or fix the state directory, then retry.",
    },
    "SANDBOX_UNAVAILABLE": {
        "": "{reason}",
        "state-dir": "the session directory {cwd} lies inside dshd's state directory, which "
        "no tool may touch; use a session in a project directory",
    },
    "UNKNOWN_TOOL": {
        "": "there is no tool named {name!r}; the tools are: {known}",
    },
    "INVALID_ARGUMENTS": {
        "": "{problem}; nothing ran",
        "json": "the arguments are not valid JSON ({error}); nothing ran",
        "object": "the arguments must be a JSON object; nothing ran",
    },
    "LIMIT_EXCEEDED": {
        "": "{limit}; nothing ran. Wait for running calls to finish, then retry",
    },
    "TOOL_TIMEOUT": {
        "": "timed out after {timeout} s; the process group was killed",
    },
    "TOOL_CANCELLED": {
        "": "cancelled; the process group was killed",
        "shutdown": "dshd is shutting down: the call was cancelled and its process group killed",
        "stopped": "the daemon stopped while the call ran; its process group was killed",
        "crashed": "the session crashed ({error}) while the call ran; its process group was "
        "killed",
    },
    "TOOL_FAILED": {
        "": "{error}",
        "internal": "dshd could not run this call ({error}); see the daemon log",
    },
    "TOOL_NOT_STARTED": {"": NOT_STARTED_TEXT, "not-granted": NOT_GRANTED_TEXT},
    "TOOL_OUTCOME_UNKNOWN": {"": OUTCOME_UNKNOWN_TEXT},
}


def sentence(code: str, variant: str = "", **fields: Any) -> str:
    """The sentence for ``code`` (and ``variant``), its fields filled in. KeyError for a code
    or variant the table does not have (a bug: every early exit is in the table)."""
    return SENTENCES[code][variant].format(**fields)


class CallFailed(Exception):
    """A call ends before or instead of running: ``code`` is its errorCode, ``sentence`` the
    text from :data:`SENTENCES` (raised by the gate, the barrier, the call pipeline)."""

    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(sentence)
        self.code = code
        self.sentence = sentence
