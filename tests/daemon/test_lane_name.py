"""The lane's ``session`` carries the session's name (PROTOCOL.md §3.3), so a mirror sees a
rename: ``session.rename`` is a control change of the lane, published at once, and a
re-subscription's base batch carries the name as it stands."""

from __future__ import annotations


async def test_the_lane_shows_the_name_and_a_rename_reaches_a_mirror(daemon, daemon_clock,
                                                                     nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire, name="build")
    lane = await wire.subscribe(sid)
    await wire.wait_lane(lane, lambda l: l.value is not None, "the base batch")
    assert lane.value["session"]["name"] == "build"
    await wire.call("session.rename", {"sessionId": sid, "name": "deploy"})
    await wire.wait_lane(lane, lambda l: l.value["session"]["name"] == "deploy",
                         "the rename in the mirror")
    await wire.call("session.rename", {"sessionId": sid, "name": None})
    await wire.wait_lane(lane, lambda l: l.value["session"]["name"] is None,
                         "the cleared name in the mirror")
    unnamed = await daemon.create_session(wire)
    again = await wire.subscribe(unnamed)
    await wire.wait_lane(again, lambda l: l.value is not None, "the base batch")
    assert again.value["session"]["name"] is None and "name" in again.value["session"]
