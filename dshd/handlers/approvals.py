"""Approval requests and rules (PROTOCOL.md §3.4): approval.decide, approval.rules,
approval.revokeRule, approval.list.

Theory of operation: each handler opens the session through ``port.open_session`` (the
ownership check) and reaches its approval desk through the session's ``approvals`` port
(``dshd.sessions.approval.ApprovalDesk``); the desk raises its refusals as ``dshd.errors``
classes (-32007, -32011, -32602 ``BAD_RULE`` / ``RULE_NOT_FOUND``, -32013 ``RULE_LIMIT``),
mapped once by the dispatcher. A rule is made or revoked "by" the connection's uid.
``approval.list`` reads only sessions that are open (a closed session has no pending
request: a session with one is never closed as idle, and one asked again after a restart is
opened at the start), those the caller may use, oldest request first.
"""

from __future__ import annotations

from protocol import approvals as a
from protocol import methods as m

from . import port
from .context import ConnectionPort, may_use

__all__ = ["approval_decide", "approval_list", "approval_revoke_rule", "approval_rules"]


async def approval_decide(conn: ConnectionPort, p: a.ApprovalDecideParams) -> a.ApprovalDecideResult:
    session = await port.open_session(conn, p.session_id)
    desk = session.approvals
    if p.decision != "allow-for-session":
        return a.ApprovalDecideResult(outcome=desk.decide(p.approval_id, p.decision))
    kind = p.rule.kind if p.rule is not None else None
    command = p.rule.command if p.rule is not None else None
    outcome, rule_id = await desk.allow_for_session(p.approval_id, kind, command, conn.uid)
    return a.ApprovalDecideResult(outcome=outcome, rule_id=rule_id)


async def approval_rules(conn: ConnectionPort, p: a.ApprovalRulesParams) -> a.ApprovalRulesResult:
    session = await port.open_session(conn, p.session_id)
    return a.ApprovalRulesResult(rules=[a.ApprovalRule(
        rule_id=r["ruleId"], kind=r["kind"], command=r["command"], by=r["by"], at=r["at"],
        sandbox=r["sandbox"], **({"words": r["words"]} if "words" in r else {}))
        for r in session.approvals.rules.listed()])


async def approval_revoke_rule(conn: ConnectionPort, p: a.RevokeRuleParams) -> m.EmptyResult:
    session = await port.open_session(conn, p.session_id)
    await session.approvals.revoke_rule(p.rule_id, conn.uid)
    return m.EmptyResult()


async def approval_list(conn: ConnectionPort, p: m.EmptyParams) -> a.ApprovalListResult:
    out: list[a.PendingApproval] = []
    for session in conn.daemon.registry.open_sessions():
        if not may_use(conn, session.owner):
            continue
        requests = session.approvals.requests()
        name = session.info().get("name") if requests else None
        out += [a.PendingApproval(
            session_id=session.id, session_name=name, approval_id=approval_id,
            call_id=r.call_id, tool=r.tool, summary=r.summary, asked_at=r.asked_at)
            for approval_id, r in requests]
    out.sort(key=lambda x: (x.asked_at, x.session_id, x.approval_id))
    return a.ApprovalListResult(approvals=out)
