"""The re-ask of an approval left undecided by a restart (``ApprovalDesk.reask``), driven through
the fake ``ApprovalPort`` of ``test_approval_port`` on trio's autojump clock (the grace is
virtual time). Each re-ask row of the module doc's decision table, the same ``approvalId``, no
second ``approval/asked``, and the grace: an answerer that comes and goes within it does not end
the wait; the end of the grace without one does."""

from __future__ import annotations

import pytest
import trio

from dshd import errors
from dshd.results import CallFailed
from dshd.sessions.approval import ApprovalDesk
from tests.sessions.test_approval_port import FakeCall, FakePort, _append

AID = "a-0123456789ab"
GRACE = 120.0


async def _reask(desk: ApprovalDesk, call: FakeCall, grace: float = GRACE) -> str:
    """The re-ask's outcome: ``allowed-once`` or the errorCode it refused with."""
    try:
        await desk.reask(call, AID, grace=grace)
    except CallFailed as failed:
        return failed.code
    return "allowed-once"


@pytest.mark.parametrize("decision, outcome, decided", [
    ("allow", "allowed-once", ("allowed-once", "answerer")),
    ("reject", "APPROVAL_REJECTED", ("rejected", "answerer")),
])
async def test_an_answerer_that_attaches_after_the_start_decides(autojump_clock, decision,
                                                                 outcome, decided):
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    result: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(result, _reask(desk, FakeCall())))
        await port.changed.wait()
        assert list(port.shown) == [AID]  # the same approvalId, in the lane's approvals
        request = port.shown[AID]
        assert (request.call_id, request.tool, request.summary) == ("c-1", "bash", "rm -rf build")
        await trio.sleep(GRACE / 2)  # nobody yet: still waiting
        assert not result and AID in desk.pending
        desk.answerer_joined("sub-late")
        assert desk.decide(AID, decision) == decided[0]
    assert result == [outcome]
    assert port.events == [("approval/decided",
                            {"approvalId": AID, "outcome": decided[0], "by": decided[1]})]
    assert not port.shown and not desk.pending
    with pytest.raises(errors.AlreadyDecided):
        desk.decide(AID, "allow")


async def test_no_answerer_within_the_grace_is_unavailable(autojump_clock):
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    start = trio.current_time()
    assert await _reask(desk, FakeCall()) == "APPROVAL_UNAVAILABLE"
    assert trio.current_time() - start == pytest.approx(GRACE)
    assert port.decided() == [("unavailable", "policy")]
    assert not port.shown and not desk.pending


async def test_an_answerer_that_leaves_within_the_grace_does_not_end_the_wait(autojump_clock):
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    result: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(result, _reask(desk, FakeCall())))
        await port.changed.wait()
        desk.answerer_joined("sub-1")
        desk.answerer_left("sub-1")  # a client reconnecting: within the grace
        await trio.sleep(GRACE / 2)
        assert not result
        desk.answerer_joined("sub-2")
        desk.decide(AID, "allow")
    assert result == ["allowed-once"]


async def test_after_the_grace_the_usual_rules_hold(autojump_clock):
    """An answerer attached at the end of the grace: the request waits on; when the last one
    leaves after the grace, a new grace runs from then (the one rule), then unavailable."""
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    result: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(result, _reask(desk, FakeCall())))
        await port.changed.wait()
        desk.answerer_joined("sub-1")
        await trio.sleep(GRACE * 3)
        assert not result and AID in port.shown
        left = trio.current_time()
        desk.answerer_left("sub-1")
    assert result == ["APPROVAL_UNAVAILABLE"]
    assert trio.current_time() - left == pytest.approx(GRACE)
    assert port.decided() == [("unavailable", "policy")]


async def test_the_policy_never_rejects_a_reask_at_once(autojump_clock):
    port = FakePort("never")
    desk = ApprovalDesk(port, "s-1")
    desk.answerer_joined("sub-1")
    start = trio.current_time()
    assert await _reask(desk, FakeCall()) == "APPROVAL_REJECTED"
    assert trio.current_time() == start and not port.shown
    assert port.events == [("approval/decided",
                            {"approvalId": AID, "outcome": "rejected", "by": "policy"})]


async def test_a_cancel_while_reasked_is_recorded(autojump_clock):
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: desk.reask(FakeCall(), AID, grace=GRACE))
            await port.changed.wait()
            scope.cancel()
    assert scope.cancelled_caught
    assert port.decided() == [("cancelled", "caller")] and not port.shown and not desk.pending


async def test_a_reask_whose_decision_cannot_be_recorded_rejects(autojump_clock):
    port = FakePort(fail_on="approval/decided")
    desk = ApprovalDesk(port, "s-1")
    result: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(result, _reask(desk, FakeCall())))
        await port.changed.wait()
        desk.answerer_joined("sub-1")
        desk.decide(AID, "allow")
    assert result == ["APPROVAL_REJECTED"]


async def test_a_detaching_stop_leaves_the_approval_undecided(autojump_clock):
    """``detach`` then the call's cancel (the daemon stops): no ``approval/decided``, the
    request is hidden, and an answerer leaving afterwards decides nothing either."""
    port = FakePort()
    desk = ApprovalDesk(port, "s-1")
    desk.answerer_joined("sub-1")
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(desk.gate, FakeCall())
            await port.changed.wait()
            desk.detach()
            desk.answerer_left("sub-1")
            scope.cancel()
    assert scope.cancelled_caught
    assert [t for t, _ in port.events] == ["approval/asked"]
    assert not port.shown and not desk.pending
