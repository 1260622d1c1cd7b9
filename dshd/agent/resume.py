"""Agent turns across a daemon restart: which open turns go on, and taking one up (HOST.md §7).

Theory of operation: the log is the turn's memory, so a turn that was open when the daemon
stopped (``turn/start`` without ``turn/end``) is read back from the events, never from a
saved loop state. One walk (:func:`open_turns`) finds, per open turn, its open step
(``step/start`` without ``step/end``) and what that step's model answer named: the
``toolCalls`` of its (non-partial) ``message/assistant``.

* **Resumable** (:func:`resumable_turns`): the open step's answer named tool calls, and every
  one of them that got a ``tool/call`` either has its ``tool/result`` or is a call the
  session takes up again (``resumed_call_ids``: adopted from a live call host, settled from
  its ``exit.json``, or re-asked at the gate). The step was waiting for tool results, and
  those results will come. A named call that never got its ``tool/call`` is closed by repair
  (``TOOL_NOT_STARTED``) and the model reads that in its next step. Only the most recently
  started open turn can be resumable (a session runs one turn at a time).
* **Not resumable**: the open step has no answer yet (the model request was in flight: its
  answer is lost), the answer named no calls, a started call will never settle here (its
  result is repair's ``TOOL_OUTCOME_UNKNOWN``: the turn would go on without the person who
  watched it knowing why), or no step is open. Repair ends such a turn ``interrupted``
  (STORAGE.md §5), as before.
* **Taking one up** (:func:`resume_turn`): the session, once its calls are back, hands the
  turn to its ``TurnDriver`` (``dshd.agent.turn``) with the open step's number, id, text and
  calls; the loop waits for those calls' results, closes the step and goes on with the next
  model step, as if no restart happened: its history is the log's (``dshd.agent.history``),
  with the real results where they landed.

Pure except :func:`resume_turn`, which starts the turn's task through the session's port
(and returns once it is started).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from typing import Any

import structlog

from protocol.lane import TurnCall

from .port import SessionPort
from .turn import TurnDriver

log = structlog.get_logger("dshd.agent")

_STEP_NUMBER = re.compile(r"s(\d+)\Z")


@dataclass
class OpenTurn:
    """An open turn as the log has it: its open step and what that step's answer named."""

    turn_id: str
    steps: int = 0  # step/start events seen (the fallback for a step number)
    step_id: str | None = None  # the open step (None: between steps, or none yet)
    answered: bool = False  # the open step has its (non-partial) model answer
    text: str = ""
    calls: list[str] = field(default_factory=list)  # callIds the answer named, in order
    names: dict[str, str] = field(default_factory=dict)  # callId -> the tool the answer named

    @property
    def step(self) -> int:
        """The open step's number (``s<n>``, as the loop names steps)."""
        m = _STEP_NUMBER.match(self.step_id or "")
        return int(m.group(1)) if m else self.steps


def _data(ev: Any) -> dict:
    data = getattr(ev, "data", None)
    return data if isinstance(data, dict) else {}


def open_turns(events: Iterable[Any]) -> dict[str, OpenTurn]:
    """Open turns by turnId, oldest started first (module doc). ``events``: ``Event``-like
    objects with ``type`` and ``data``, oldest first; odd data is skipped."""
    turns: dict[str, OpenTurn] = {}
    for ev in events:
        t, d = getattr(ev, "type", None), _data(ev)
        turn_id = d.get("turnId")
        if not isinstance(turn_id, str):
            continue
        if t == "turn/start":
            turns.pop(turn_id, None)
            turns[turn_id] = OpenTurn(turn_id)
        elif t == "turn/end":
            turns.pop(turn_id, None)
        elif turn_id not in turns:
            continue
        elif t == "step/start":
            turn = turns[turn_id]
            turn.steps += 1
            turn.step_id, turn.answered, turn.text, turn.calls = d.get("stepId"), False, "", []
        elif t == "step/end" and d.get("stepId") == turns[turn_id].step_id:
            turns[turn_id].step_id = None
        elif (t == "message/assistant" and not d.get("partial")
              and turns[turn_id].step_id is not None
              and d.get("stepId") == turns[turn_id].step_id):
            turn = turns[turn_id]
            turn.answered, turn.text = True, str(d.get("text") or "")
            named = [c for c in d.get("toolCalls") or []
                     if isinstance(c, dict) and isinstance(c.get("callId"), str)]
            turn.calls = [c["callId"] for c in named]
            turn.names = {c["callId"]: c["name"] for c in named if isinstance(c.get("name"), str)}
    return turns


def _call_states(events: Iterable[Any]) -> tuple[set[str], set[str]]:
    """(callIds with a ``tool/call``, callIds with a ``tool/result``)."""
    called: set[str] = set()
    resulted: set[str] = set()
    for ev in events:
        cid = _data(ev).get("callId")
        if isinstance(cid, str):
            if ev.type == "tool/call":
                called.add(cid)
            elif ev.type == "tool/result":
                resulted.add(cid)
    return called, resulted


def resumable_turns(events: Iterable[Any], resumed_call_ids: Set[str]) -> set[str]:
    """The turnIds to take up after a restart (module doc): at most one."""
    events = list(events)
    turns = open_turns(events)
    if not turns:
        return set()
    turn = list(turns.values())[-1]  # the most recently started open turn
    if turn.step_id is None or not turn.answered or not turn.calls:
        return set()
    called, resulted = _call_states(events)
    if all(cid in resulted or cid in resumed_call_ids
           for cid in turn.calls if cid in called):
        return {turn.turn_id}
    return set()


def lane_calls(events: Iterable[Any], turn: OpenTurn) -> list[TurnCall]:
    """The lane's ``turn.calls`` of ``turn``'s open step as the log has them: ``settled`` (with
    the result's codes) for a call with its ``tool/result``, else ``proposed`` (the lane takes
    the state of a call back in ``tools`` from there)."""
    wanted = set(turn.calls)
    results: dict[str, dict] = {}
    for ev in events:
        d = _data(ev)
        if getattr(ev, "type", None) == "tool/result" and d.get("callId") in wanted:
            results[d["callId"]] = d
    out = []
    for cid in turn.calls:
        r = results.get(cid)
        if r is None:
            out.append(TurnCall(cid, turn.names.get(cid), "proposed"))
            continue
        exit_code = r.get("exitCode")
        error_code = r.get("errorCode")
        out.append(TurnCall(cid, turn.names.get(cid), "settled",
                            exit_code if isinstance(exit_code, int) else None,
                            error_code if isinstance(error_code, str) else None))
    return out


async def resume_turn(port: SessionPort, events: Iterable[Any], turn_id: str) -> bool:
    """Take up the open turn ``turn_id`` (module doc); False (logged) when the events hold no
    such turn with an answered open step, or the session runs a turn already / is closing."""
    events = list(events)
    turn = open_turns(events).get(turn_id)
    if turn is None or turn.step_id is None or not turn.answered:
        log.warning("turn.not_resumable", session=port.id, turn=turn_id)
        return False
    try:
        TurnDriver.of(port).resume(turn_id, turn.step, turn.step_id, turn.text,
                                   list(lane_calls(events, turn)))
    except Exception as exc:  # TurnBusy, SessionClosing: the turn stays open; repair ends it
        log.warning("turn.not_resumed", session=port.id, turn=turn_id, error=str(exc))
        return False
    log.info("turn.resumed", session=port.id, turn=turn_id, step=turn.step_id,
             waiting=turn.calls)
    return True
