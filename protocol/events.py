"""A session's events (STORAGE.md §3) as typed values: the data of each type, one tagged union.

Theory of operation: a log record is ``{"seq", "time", "type", "data", "ignorable"?}``; its
``type`` says what ``data`` holds. Each known type is one struct here, tagged by ``type``
(msgspec's tagged unions), with its ``data`` as a struct of snake_case attributes
(``rename="camel"``: ``data.call_id`` reads ``"callId"``). :data:`Event` is the union of them;
:func:`decode_event` / :func:`decode_events` read ``session.events``' answer (or a log line)
into it. A type this module does not know (a newer dshd's ``ignorable`` event) is not an
error: it decodes as :class:`UnknownEvent` with its ``data`` a plain dict, so a reader skips
what it does not know, as STORAGE.md §3 asks. Unknown keys inside ``data`` are ignored. An
event also reads as its JSON record (``protocol.jsonview``: ``event["type"]``,
``event["data"]["callId"]``).

The daemon writes events with its own storage structs; this module is the reading half, for
clients and for anything that wants the data typed. :func:`event_type` names an event's type
whatever it decoded as. :func:`closer_label` names a crash closer (what a repair appends,
STORAGE.md §5) from an event's type and plain data: the words both fsck checks print, the
daemon's offline one (``dshd.storage.fsck``) and the client's online one (``client.fsck``).
Pure: msgspec only.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
from msgspec import UNSET, UnsetType

from .jsonview import JsonView
from .lane import ToolResult

__all__ = [
    "AnyEvent", "ApprovalAsked", "ApprovalAskedData", "ApprovalDecided", "ApprovalDecidedData",
    "ApprovalPolicyData", "ApprovalPolicySet", "ApprovalRuleData", "ApprovalRuleMade",
    "ApprovalRuleRevoked", "ApprovalRuleRevokedData", "AssistantMessage", "AssistantMessageData",
    "Event", "EVENT_TYPES", "ProposedCall", "SandboxModeData", "SandboxModeSet", "SessionEnv",
    "SessionEnvData", "SessionOwner", "SessionOwnerData", "StepData", "StepEnd", "StepStart",
    "ToolCall", "ToolCallData", "ToolResult", "ToolResultEvent", "TurnData", "TurnEnd",
    "TurnEndData", "TurnStart", "UnknownEvent", "UserMessage", "UserMessageData",
    "REPAIR_CODES", "closer_label", "decode_event", "decode_events", "event_type",
]

#: The errorCodes of the results a crash repair appends (STORAGE.md §5, EXEC.md §1).
REPAIR_CODES = ("TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED")


class _Data(JsonView, msgspec.Struct, frozen=True, kw_only=True, rename="camel",
            omit_defaults=True):
    """Base of event data: snake_case attributes, camelCase in the log; absent is ``UNSET``,
    and a flag at its default (``steer``, ``partial``: False) is left out, as the log does."""


class ApprovalPolicyData(_Data):
    policy: str
    source: str | UnsetType = UNSET


class SandboxModeData(_Data):
    mode: str
    source: str | UnsetType = UNSET
    #: The uid that changed it (``session.setSandbox``).
    by: int | UnsetType = UNSET


class SessionOwnerData(_Data):
    uid: int


class SessionEnvData(_Data):
    env: dict[str, str]


class TurnData(_Data):
    turn_id: str


class TurnEndData(_Data):
    """``reason``: completed, cancelled, error or interrupted; ``error_code``/``message`` with
    error (or interrupted)."""

    turn_id: str
    reason: str
    error_code: str | UnsetType = UNSET
    message: str | UnsetType = UNSET


class StepData(_Data):
    turn_id: str
    step_id: str


class UserMessageData(_Data):
    text: str
    turn_id: str | UnsetType = UNSET
    steer: bool = False


class ProposedCall(_Data):
    """A call a model proposed; ``arguments`` is its raw JSON string, as the model sent it."""

    call_id: str
    name: str
    arguments: str


class AssistantMessageData(_Data):
    text: str
    turn_id: str | UnsetType = UNSET
    step_id: str | UnsetType = UNSET
    tool_calls: list[ProposedCall] | UnsetType = UNSET
    partial: bool = False
    finish_reason: str | None | UnsetType = UNSET
    model: str | None | UnsetType = UNSET
    usage: dict[str, Any] | None | UnsetType = UNSET
    attempts: int | UnsetType = UNSET


class ToolCallData(_Data):
    """``arguments``: the call's arguments as a raw JSON string."""

    call_id: str
    name: str
    arguments: str
    turn_id: str | UnsetType = UNSET
    step_id: str | UnsetType = UNSET


class ApprovalAskedData(_Data):
    approval_id: str
    call_id: str
    tool: str
    summary: str


class ApprovalDecidedData(_Data):
    """``by``: caller, answerer, policy, rule or repair; ``ruleId``: the rule that decided it
    (``by: rule``) or that its ``allow-for-session`` made."""

    approval_id: str
    outcome: str
    by: str | UnsetType = UNSET
    rule_id: str | UnsetType = UNSET


class ApprovalRuleData(_Data):
    """``approval/rule``: ``command`` (exact) or ``words`` (prefix); ``by`` uid; ``at`` ms."""

    rule_id: str
    kind: str
    command: str | UnsetType = UNSET
    words: list[str] | UnsetType = UNSET
    by: Any = None
    at: int = 0


class ApprovalRuleRevokedData(_Data):
    rule_id: str
    by: Any = None


class _Event(JsonView, msgspec.Struct, frozen=True, kw_only=True, tag_field="type",
             omit_defaults=True):
    """Base of the event union: ``seq`` (dense from 0), ``time`` (ms since the epoch);
    ``ignorable`` is left out when False, as the log does."""

    seq: int
    time: int
    ignorable: bool = False


class ApprovalPolicySet(_Event, tag="approval/policy"):
    data: ApprovalPolicyData


class SandboxModeSet(_Event, tag="sandbox/mode"):
    data: SandboxModeData


class SessionOwner(_Event, tag="session/owner"):
    data: SessionOwnerData


class SessionEnv(_Event, tag="session/env"):
    data: SessionEnvData


class TurnStart(_Event, tag="turn/start"):
    data: TurnData


class TurnEnd(_Event, tag="turn/end"):
    data: TurnEndData


class StepStart(_Event, tag="step/start"):
    data: StepData


class StepEnd(_Event, tag="step/end"):
    data: StepData


class UserMessage(_Event, tag="message/user"):
    data: UserMessageData


class AssistantMessage(_Event, tag="message/assistant"):
    data: AssistantMessageData


class ToolCall(_Event, tag="tool/call"):
    data: ToolCallData


class ApprovalAsked(_Event, tag="approval/asked"):
    data: ApprovalAskedData


class ApprovalDecided(_Event, tag="approval/decided"):
    data: ApprovalDecidedData


class ApprovalRuleMade(_Event, tag="approval/rule"):
    data: ApprovalRuleData


class ApprovalRuleRevoked(_Event, tag="approval/rule-revoked"):
    data: ApprovalRuleRevokedData


class ToolResultEvent(_Event, tag="tool/result"):
    """``data``: the ToolResult as recorded, the struct ``tool.wait`` answers with."""

    data: ToolResult


class UnknownEvent(JsonView, msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An event of a type this module does not know; ``data`` stays a plain dict."""

    seq: int
    time: int
    type: str
    data: dict[str, Any]
    ignorable: bool = False


Event = Union[
    ApprovalPolicySet, SandboxModeSet, SessionOwner, SessionEnv, TurnStart, TurnEnd, StepStart,
    StepEnd, UserMessage, AssistantMessage, ToolCall, ApprovalAsked, ApprovalDecided,
    ApprovalRuleMade, ApprovalRuleRevoked, ToolResultEvent,
]
AnyEvent = Union[Event, UnknownEvent]

#: The event types of STORAGE.md §3 that :data:`Event` types.
EVENT_TYPES: frozenset[str] = frozenset(
    cls.__struct_config__.tag for cls in Event.__args__  # type: ignore[attr-defined]
)

_event_decoder = msgspec.json.Decoder(Event)
_unknown_decoder = msgspec.json.Decoder(UnknownEvent)


def decode_event(raw: bytes | msgspec.Raw | str) -> AnyEvent:
    """One event from its JSON; an unknown ``type`` gives an :class:`UnknownEvent`.

    Raises ``msgspec.ValidationError`` / ``DecodeError`` when a known type's data does not
    have its shape (or the JSON is not an event at all).
    """
    generic = _unknown_decoder.decode(raw)
    if generic.type not in EVENT_TYPES:
        return generic
    return _event_decoder.decode(raw)


def decode_events(raws: list[msgspec.Raw] | list[bytes]) -> list[AnyEvent]:
    """``session.events``' ``events`` (each ``msgspec.Raw``), typed, oldest first."""
    return [decode_event(raw) for raw in raws]


def event_type(event: AnyEvent) -> str:
    """The ``type`` of an event: a known type's tag, or an :class:`UnknownEvent`'s own."""
    if isinstance(event, UnknownEvent):
        return event.type
    return type(event).__struct_config__.tag  # type: ignore[return-value]


def closer_label(type_: str, data: Any) -> str | None:
    """A short label for a crash closer (``None`` when the event is not one): a result with a
    repair's errorCode, an approval decided ``by: repair``, a turn ended ``interrupted``.
    ``data`` is the event's data as plain JSON (camelCase keys)."""
    if not isinstance(data, dict):
        return None
    if type_ == "tool/result" and data.get("errorCode") in REPAIR_CODES:
        return f"call {data.get('callId')} {data['errorCode']}"
    if type_ == "approval/decided" and data.get("by") == "repair":
        return f"approval {data.get('approvalId')} {data.get('outcome', 'cancelled')}"
    if type_ == "turn/end" and data.get("reason") == "interrupted":
        return f"turn {data.get('turnId')} interrupted"
    return None
