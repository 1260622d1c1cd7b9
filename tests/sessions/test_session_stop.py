"""Stopping sessions through the registry with the caller's deadline (a real log on disk).

``SessionRegistry.aclose(deadline)`` hands the deadline to every open session; the session's
wind-down (and every shielded settle in it) ends by then. A running turn is stopped through
the agent's port: it ends ``interrupted`` and ``turn/end`` is in the log."""

from __future__ import annotations

import json

import trio

from dshd import errors
from dshd.agent import TurnDriver
from dshd.config import Config, ModelConfig
from dshd.sessions.registry import SessionRegistry
from dshd.storage.reader import read_log


async def test_aclose_passes_the_callers_deadline_and_stops_the_turn(tmp_path):
    state = tmp_path / "state"
    (state / "sessions").mkdir(parents=True)
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"text": "a b c d e f", "paceMs": 60000}) + "\n")
    config = Config(model=ModelConfig(provider="scripted", script=str(script)))
    registry = SessionRegistry(config, state, sandbox=None)
    work = tmp_path / "work"
    work.mkdir()
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        session = await registry.create(str(work), None, None, None, None)
        driver = TurnDriver.of(session)
        driver.start("hi")
        with trio.fail_after(10):
            while not any(e.type == "step/start" for e in await session.events(-1, 100)):
                await trio.sleep(0.01)
        deadline = trio.current_time() + 30
        with trio.fail_after(10):  # liveness: the wind-down does not wait for the model
            await registry.aclose(deadline)
        assert session.finished.is_set() and session.deadline() == deadline
        try:
            driver.start("too late")
        except errors.SessionClosing as exc:
            assert exc.data == {"code": "SESSION_CLOSING"}
        else:
            raise AssertionError("a stopped session accepted a turn")
        nursery.cancel_scope.cancel()
    events = read_log(state / "sessions" / session.id, session.id).events
    ends = [e.data for e in events if e.type == "turn/end"]
    assert ends and ends[0]["reason"] == "interrupted"
