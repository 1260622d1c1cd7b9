"""The approval methods' params and results (PROTOCOL.md §3.4): decide, rules, the list.

Theory of operation: structs only (msgspec, camelCase on the wire); ``protocol.methods``
puts them in the one method table. ``approval.decide``'s ``decision``: ``allow`` (= allow
once), its synonym ``allow-once``, ``allow-for-session`` (with ``rule``; without one, an
exact rule of the call's own command) or ``reject``. What a rule allows is
``protocol.shellwords``'. Pure: msgspec only.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from .structs import _Params, _Result

__all__ = ["ApprovalDecideParams", "ApprovalDecideResult", "ApprovalListResult",
           "ApprovalRule", "ApprovalRuleSpec", "ApprovalRulesParams", "ApprovalRulesResult",
           "PendingApproval", "RevokeRuleParams"]

Decision = Literal["allow", "allow-once", "allow-for-session", "reject"]


class ApprovalRuleSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A rule asked for with ``allow-for-session``: ``exact`` (the exact command text) or
    ``prefix`` (leading words of one simple command, given as a command string)."""

    kind: Literal["exact", "prefix"]
    command: str


class ApprovalDecideParams(_Params):
    session_id: str
    approval_id: str
    decision: Decision
    rule: ApprovalRuleSpec | None = None

    def __post_init__(self) -> None:
        if self.rule is not None and self.decision != "allow-for-session":
            raise ValueError("a rule goes with decision allow-for-session only - at `$.rule`")


class ApprovalDecideResult(_Result, omit_defaults=True):
    """``ruleId``: the rule an ``allow-for-session`` made (left out otherwise)."""

    outcome: str
    rule_id: str | UnsetType = UNSET


class ApprovalRulesParams(_Params):
    session_id: str


class ApprovalRule(_Result, omit_defaults=True):
    """A live rule: ``command`` is the exact text, or a prefix's words as a command line
    (then ``words`` too); ``by``: the uid that made it; ``at``: ms since the epoch."""

    rule_id: str
    kind: str
    command: str
    by: Any = None
    at: int = 0
    words: list[str] | UnsetType = UNSET
    #: The session's sandbox mode when the rule was made: it matches only at that mode or a
    #: stricter one (PROTOCOL.md §3.4).
    sandbox: str | UnsetType = UNSET


class ApprovalRulesResult(_Result):
    rules: list[ApprovalRule]


class RevokeRuleParams(_Params):
    session_id: str
    rule_id: str


class PendingApproval(_Result):
    """One request waiting for a decision (``approval.list``); ``askedAt`` ms."""

    session_id: str
    session_name: str | None
    approval_id: str
    call_id: str
    tool: str
    summary: str
    asked_at: int


class ApprovalListResult(_Result):
    approvals: list[PendingApproval]
