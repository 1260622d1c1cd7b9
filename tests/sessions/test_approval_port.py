"""The approval gate driven through a fake ``ApprovalPort`` (no session, no log).

``dshd.sessions.approval.ApprovalDesk`` records through ``port.record`` and shows requests
through ``show_approval`` / ``hide_approval``; this checks the decision table of its module
doc row by row, the audit pair, fail-closed audit, cancellation through the call's scope, and
the errors ``approval.decide`` answers with."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import trio

from dshd import errors
from dshd.results import CallFailed
from dshd.sessions.approval import ApprovalDesk
from dshd.storage.errors import StorageError


@dataclass
class FakeCall:
    call_id: str = "c-1"
    name: str = "bash"
    arguments: dict = None  # type: ignore[assignment]
    approved: bool = False

    def __post_init__(self) -> None:
        self.arguments = self.arguments or {"command": "rm -rf build"}


class FakePort:
    def __init__(self, policy: str = "ask", fail_on: str | None = None) -> None:
        self.policy = policy
        self.mode = "workspace-write"  # the session's sandbox mode (approval rules)
        self.fail_on = fail_on
        self.events: list[tuple[str, dict]] = []
        self.shown: dict[str, object] = {}
        self.changed = trio.Event()
        self.durable = -1

    def record(self, type_: str, data: dict) -> int:
        if type_ == self.fail_on:
            raise OSError("disk says no")
        self.events.append((type_, data))
        return len(self.events) - 1

    async def wait_durable(self, seq: int) -> None:
        await trio.lowlevel.checkpoint()
        if self.fail_on == "durable":
            raise StorageError("fsync says no")
        self.durable = max(self.durable, seq)

    def show_approval(self, approval_id, request) -> None:
        assert self.durable >= seq_of(self.events, approval_id), "shown before it was durable"
        self.shown[approval_id] = request
        self.changed.set()

    def hide_approval(self, approval_id) -> None:
        self.shown.pop(approval_id, None)

    def decided(self) -> list[tuple[str, str]]:
        return [(d["outcome"], d["by"]) for t, d in self.events if t == "approval/decided"]


def seq_of(events: list[tuple[str, dict]], approval_id: str) -> int:
    """Seq (index) of the ``approval/asked`` of ``approval_id``; -1 for a re-ask's (logged)."""
    return next((i for i, (t, d) in enumerate(events)
                 if t == "approval/asked" and d["approvalId"] == approval_id), -1)


async def _gate(desk: ApprovalDesk, call: FakeCall) -> str:
    try:
        await desk.gate(call)
    except CallFailed as failed:
        return failed.code
    return "allowed-once"


@pytest.mark.parametrize("policy, approved, answerer, outcome, decided", [
    ("ask", True, False, "allowed-once", ("allowed-once", "caller")),
    ("never", False, True, "APPROVAL_REJECTED", ("rejected", "policy")),
    ("ask", False, False, "APPROVAL_UNAVAILABLE", ("unavailable", "policy")),
])
async def test_the_gate_decides_without_asking(policy, approved, answerer, outcome, decided):
    port = FakePort(policy)
    desk = ApprovalDesk(port, "s-1")
    if answerer:
        desk.answerer_joined("sub-1")
    assert await _gate(desk, FakeCall(approved=approved)) == outcome
    assert port.decided() == [decided] and not port.shown
    (asked_type, asked), _ = port.events
    assert asked_type == "approval/asked" and asked["summary"] == "rm -rf build"
    assert asked["approvalId"] == port.events[1][1]["approvalId"]


@pytest.mark.parametrize("decision, outcome", [("allow", "allowed-once"),
                                               ("reject", "APPROVAL_REJECTED")])
async def test_an_answerer_decides(decision, outcome):
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    desk.answerer_joined("sub-1")
    result = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(result, _gate(desk, FakeCall())))
        await port.changed.wait()
        (aid, request), = port.shown.items()
        assert (request.call_id, request.tool, request.summary) == ("c-1", "bash", "rm -rf build")
        desk.decide(aid, decision)
    assert result == [outcome] and not port.shown
    with pytest.raises(errors.AlreadyDecided) as again:
        desk.decide(aid, "allow")
    expected = "allowed-once" if decision == "allow" else "rejected"
    assert again.value.data == {"outcome": expected}
    assert str(again.value) == f"approval {aid} was already decided: {expected}"


async def _append(out: list, awaitable) -> None:
    out.append(await awaitable)


async def test_the_last_answerer_leaving_makes_it_unavailable():
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    desk.answerer_joined("sub-1")
    result = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(result, _gate(desk, FakeCall())))
        await port.changed.wait()
        desk.answerer_left("sub-1")
    assert result == ["APPROVAL_UNAVAILABLE"]
    assert port.decided() == [("unavailable", "policy")]


async def test_a_cancel_of_the_calls_scope_is_recorded_and_goes_on():
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    desk.answerer_joined("sub-1")
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(desk.gate, FakeCall())
            await port.changed.wait()
            scope.cancel()
    assert scope.cancelled_caught
    assert port.decided() == [("cancelled", "caller")] and not port.shown and not desk.pending


async def test_an_audit_that_cannot_be_recorded_rejects():
    for fail_on in ("approval/asked", "approval/decided"):
        port = FakePort(fail_on=fail_on)
        assert await _gate(ApprovalDesk(port, "s-1"), FakeCall(approved=True)) == \
            "APPROVAL_REJECTED"


async def test_an_ask_that_cannot_be_made_durable_rejects_without_showing_it():
    """A request is shown only once its ``approval/asked`` is durable (so a kill -9 cannot
    lose a request a person saw); when the flush fails, the call is rejected unseen."""
    port = FakePort(fail_on="durable")
    desk = ApprovalDesk(port, "s-1")
    desk.answerer_joined("sub-1")
    with trio.fail_after(5):  # liveness: a gate that shows it would wait for a decision
        assert await _gate(desk, FakeCall()) == "APPROVAL_REJECTED"
    assert port.decided() == [("rejected", "policy")] and not port.changed.is_set()


def test_an_unknown_approval_is_not_found():
    desk = ApprovalDesk(FakePort(), "s-1")
    with pytest.raises(errors.ApprovalNotFound) as missing:
        desk.decide("a-nope", "allow")
    assert str(missing.value) == "approval a-nope not found in session s-1"
    assert errors.to_rpc_error(missing.value).code == -32007
