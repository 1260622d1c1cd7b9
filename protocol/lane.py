"""The lane view and the ToolResult as typed values (PROTOCOL.md §3.2–§3.3, OPS.md).

Theory of operation: the lane view is the JSON value a session's subscribers mirror through
``apply`` (OPS.md); a ToolResult is what ``tool.wait`` answers and what a ``tool/result`` event
records. Both used to be built as dicts in several places; these msgspec structs are their one
definition. Fields are snake_case in Python and camelCase on the wire (``rename="camel"``);
structs whose wire form omits an absent key say ``omit_defaults=True`` (and the optional field
defaults to None), the others always carry every key (a ``None`` is a JSON ``null``). Field
order is the wire's key order, so a value encoded from a struct is byte-for-byte what the dicts
it replaces encoded to. The daemon turns a struct into the builtin value the tracker and the log
hold with ``msgspec.to_builtins`` (:func:`plain`); a client decodes with ``msgspec.convert``.
Each struct also reads as the JSON object it encodes to (``protocol.jsonview.JsonView``:
``result["exitCode"]``), for code written against the plain JSON.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .jsonview import JsonView

__all__ = [
    "ApprovalRequest", "LaneSession", "LaneView", "RecentEntry", "SandboxNote", "ToolEntry",
    "ToolResult", "ToolResultDetails", "TurnCall", "TurnView", "Truncation", "plain",
]

#: The states of a call on the lane (``tools[callId].state``).
ToolState = Literal["waiting-approval", "running"]
#: The states of a turn on the lane (``turn.state``; ``dshd.agent.turn``).
TurnState = Literal["starting", "running", "waiting-tools", "cancelling"]
#: The states of one of the step's calls on the lane (``turn.calls[i].state``): named by the
#: model's answer and not started yet (``proposed``), then the call's own ``tools`` state while
#: it is there, then ``settled`` (its ``tool/result`` is in the log; refused calls too).
TurnCallState = Literal["proposed", "waiting-approval", "running", "settled"]


class Truncation(JsonView, msgspec.Struct, rename="camel"):
    """``details.truncation`` of a ToolResult and ``truncation`` of a ToolOutput: every key
    always present (but ``droppedBytes``, only when non-zero); a call that never ran has zero
    totals with the limits it would have had."""

    truncated: bool = False
    truncated_by: str | None = None
    total_bytes: int = 0
    total_lines: int = 0
    max_bytes: int = 0
    max_lines: int = 0
    #: Raw bytes the per-call disk cap dropped from the call's log (its ``firstOffset``);
    #: present only when non-zero (HOST.md §3).
    dropped_bytes: int | msgspec.UnsetType = msgspec.UNSET


class SandboxNote(JsonView, msgspec.Struct, rename="camel"):
    """``details.sandbox``: present only when the confinement was not ``full``."""

    provider: str
    completeness: str


class ToolResultDetails(JsonView, msgspec.Struct, rename="camel", omit_defaults=True):
    """``details`` of a ToolResult. Every result the session builds has ``truncation``; the
    results a crash repair appends (``dshd.storage.repair``) may have none (``details: {}``),
    so a reader takes it as optional."""

    truncation: Truncation | None = None
    spill_path: str | None = None
    exit_code: int | None = None
    sandbox: SandboxNote | None = None


class ToolResult(JsonView, msgspec.Struct, rename="camel", omit_defaults=True):
    """PROTOCOL.md §3.2. ``content`` is the command's output, or the sentence when it never
    started; ``message`` the sentence next to output; ``error_code`` the symbolic reason."""

    call_id: str
    is_error: bool
    content: str
    details: ToolResultDetails
    exit_code: int | None = None
    error_code: str | None = None
    message: str | None = None


class ToolEntry(JsonView, msgspec.Struct, rename="camel", omit_defaults=True):
    """``tools[callId]``: a call that has not settled. ``args`` are the arguments, or the first
    ``LANE_ARGS_BYTES`` of their JSON as a string when ``args_cut``; ``output`` is the live
    ToolOutput (content, details, truncation)."""

    name: str
    args: Any
    state: ToolState
    started_at: int
    output: dict
    args_cut: bool = False


class ApprovalRequest(JsonView, msgspec.Struct, rename="camel"):
    """``approvals[approvalId]``: a call waiting for a person's decision."""

    call_id: str
    tool: str
    summary: str
    asked_at: int


class RecentEntry(JsonView, msgspec.Struct, rename="camel"):
    """One of ``recent`` (newest first): a settled call."""

    call_id: str
    name: str | None
    is_error: bool
    exit_code: int | None
    error_code: str | None


class TurnCall(JsonView, msgspec.Struct, rename="camel"):
    """One of ``turn.calls``: a call the current step's answer named, in the answer's order.
    ``name`` is the tool the model named (null when a resumed turn's log does not say);
    ``exit_code`` / ``error_code`` are the settled result's (null before, and when absent)."""

    call_id: str
    name: str | None
    state: TurnCallState
    exit_code: int | None = None
    error_code: str | None = None


class TurnView(JsonView, msgspec.Struct, rename="camel"):
    """``turn``: the running turn (``null`` between turns)."""

    turn_id: str
    state: TurnState
    step: int
    step_id: str | None
    text: str
    calls: list[TurnCall]


class LaneSession(JsonView, msgspec.Struct, rename="camel"):
    session_id: str
    title: str | None
    cwd: str
    approval_policy: str
    sandbox: str
    #: The session's name (``session/name``; None: none). A rename is a control change.
    name: str | None = None


class LaneView(JsonView, msgspec.Struct, rename="camel"):
    """The whole lane value a subscriber's base batch carries."""

    session: LaneSession
    tools: dict[str, ToolEntry]
    approvals: dict[str, ApprovalRequest]
    recent: list[RecentEntry]
    turn: TurnView | None = None


def plain(value: msgspec.Struct) -> Any:
    """The builtin JSON value of a struct (dicts in wire key order), for the tracker or log."""
    return msgspec.to_builtins(value)
