"""The approval gate: "may this call run, this once?" (PROTOCOL.md §3.4, EXEC.md §1).

Theory of operation: every call passes :func:`gate` before its checkpoint barrier, and every
gated call leaves the audit pair ``approval/asked`` + ``approval/decided`` with one
``approvalId``. Outcomes are ``allowed-once``, ``rejected``, ``cancelled`` and ``unavailable``;
only ``allowed-once`` returns, every other outcome raises ``CallFailed`` with its code and a
sentence, so the call settles without running (fail closed).

Today's deciders: the caller itself (``approved: true``: the person typed the command) and the
session policy ``never``. Interactive answerers are not wired yet, so a call that would have to
ask is ``unavailable``: nothing runs without somebody having said yes.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sessions.session import Call, Session

OUTCOME_CODES = {
    "rejected": "APPROVAL_REJECTED",
    "unavailable": "APPROVAL_UNAVAILABLE",
    "cancelled": "APPROVAL_CANCELLED",
}


def summary_of(call: "Call") -> str:
    """The exact command a person is asked about (never a truncated label)."""
    if call.name == "bash":
        return str(call.arguments.get("command", ""))
    return f"{call.name} {call.arguments}"


async def gate(session: "Session", call: "Call") -> None:
    """Decide whether ``call`` may run. Returns on ``allowed-once``; raises CallFailed otherwise."""
    from .sessions.session import CallFailed

    approval_id = "a-" + secrets.token_hex(6)
    session.log.append(
        "approval/asked",
        {
            "approvalId": approval_id,
            "callId": call.call_id,
            "tool": call.name,
            "summary": summary_of(call),
        },
    )
    if call.approved:
        outcome, by = "allowed-once", "caller"
    elif session.policy == "never":
        outcome, by = "rejected", "policy"
    else:
        outcome, by = "unavailable", "policy"
    session.log.append(
        "approval/decided", {"approvalId": approval_id, "outcome": outcome, "by": by}
    )
    if outcome == "allowed-once":
        return
    sentence = {
        "rejected": "the session's approval policy is 'never': the call was rejected and did "
        "not run. Change it with `dsh policy SESSION ask`, or run it yourself with `dsh run`.",
        "unavailable": "nobody was attached to approve this call, so it did not run. Attach an "
        "answerer (`dsh attach --approve SESSION`) or submit it pre-approved (`dsh run`).",
    }[outcome]
    raise CallFailed(OUTCOME_CODES[outcome], sentence)
