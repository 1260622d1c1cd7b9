"""Subscriptions under streams a real dshd never sends (seq gaps, undecodable batches, a
stream that never heals, a batch for a stranger's subscription), against the fake peer.
What dshd does send is tested against a real daemon in ``test_client_backends``."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile

import pytest

from client.api import connect
from protocol.mirror import MirrorBroken
from client.subscription import MAX_RESTARTS_IN_A_ROW
from fake_dshd import FakeDshd, lane


@pytest.fixture
async def fake(nursery):
    d = tempfile.mkdtemp(prefix="dsh-t-", dir="/tmp")  # short: AF_UNIX paths are ≤ 107 bytes
    server = FakeDshd(os.path.join(d, "fake.sock"))
    await nursery.start(server.serve)
    yield server
    shutil.rmtree(d, ignore_errors=True)


async def test_notifications_are_routed_to_their_subscription(fake):
    fake.on_subscribe = [lambda i: [
        [["r", lane()]],
        [["s", ["tools", "c1"], {"name": "bash"}]],
        [["s", ["turn"], {"turnId": "t", "state": "running"}]],
    ]]
    async with connect(fake.path) as c:
        sub = await c.subscribe("s1")
        assert sub.subscription_id == "sub0"
        # A notification for a subscription nobody holds is dropped, not misrouted.
        await fake.notify("not-ours", [["r", {"bad": 1}]], seq=0)
        views = []
        async for view in sub:
            views.append(copy.deepcopy(view))  # the view is the mirror's live value
            if len(views) == 3:
                break
        assert views[0]["tools"] == {} and views[2]["tools"]["c1"] == {"name": "bash"}
        assert views[2]["turn"] == {"turnId": "t", "state": "running"}
        assert sub.mirror.seq == 2 and sub.resubscribes == 0
        await sub.aclose()
    assert ("unsubscribe", {"subscriptionId": "sub0"}) in fake.requests


async def test_seq_gap_resubscribes_and_continues_from_a_new_base(fake):
    fake.on_subscribe = [
        lambda i: [[["r", lane()]], [["s", ["turn"], 1]]],
        lambda i: [[["r", lane(recent=[{"callId": "x"}])]]],
    ]
    async with connect(fake.path, approvals=True) as c:
        sub = await c.subscribe("s1")
        assert (await sub.next_view())["tools"] == {}
        assert (await sub.next_view())["turn"] == 1
        await fake.notify("sub0", [["s", ["turn"], 3]], seq=5)  # a gap
        view = await sub.next_view()
        assert view["recent"] == [{"callId": "x"}] and view["turn"] is None
        assert sub.resubscribes == 1 and sub.subscription_id == "sub1"
        assert isinstance(sub.last_restart_reason, MirrorBroken)
    # Make before break: the new subscription is taken before the old one is dropped.
    methods = [(m, p) for m, p in fake.requests if m in ("subscribe", "unsubscribe")]
    assert methods[:3] == [("subscribe", {"sessionId": "s1"}), ("subscribe", {"sessionId": "s1"}),
                           ("unsubscribe", {"subscriptionId": "sub0"})]


async def test_bad_batch_resubscribes(fake):
    fake.on_subscribe = [
        lambda i: [[["r", lane()]], [["a", 0, "x"]]],  # undefined ref
        lambda i: [[["r", lane()]]],
    ]
    async with connect(fake.path) as c:
        sub = await c.subscribe("s1")
        await sub.next_view()
        await sub.next_view()
        assert sub.resubscribes == 1 and "ref" in str(sub.last_restart_reason)


async def test_endless_breakage_gives_up(fake):
    fake.on_subscribe = [lambda i: [[["a", ["x"], "no base"]]]] * (MAX_RESTARTS_IN_A_ROW + 2)
    async with connect(fake.path) as c:
        sub = await c.subscribe("s1")
        with pytest.raises(MirrorBroken, match="gave up"):
            await sub.next_view()
