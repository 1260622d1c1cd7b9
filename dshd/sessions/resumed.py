"""Calls that come back after a daemon restart: re-adopted, settled from their exit record, or
re-asked (HOST.md §7; the plan is ``dshd.sessions.resume``).

Theory of operation: the session's resume plan names each logged ``tool/call`` without a
``tool/result`` that is not lost. :func:`rebuild` makes it a :class:`~dshd.sessions.call.Call`
again -- name and arguments from its ``tool/call``, the same ``seq``, the lane entry with the
``startedAt`` of its ``tool/call`` -- in the running table (so it counts in ``max_calls``
and ``tool.cancel`` reaches it). Then:

* **adopt** (its host lives): :func:`run_adopted` re-attaches
  (``dshd.execution.hosted.adopt_hosted``) with a new capture rebuilt from the call's log,
  re-opens its pending-output sidecar (a base checkpoint first) and runs to the outcome as a
  new call would: ``tool.wait``/``follow``/``read``/``write``/``resize``/``signal``/``cancel``
  work through ``Call.host``. A host that dies while the daemon is up settles ``TOOL_FAILED``
  naming its death; one that cannot be reached is killed and settles ``TOOL_FAILED``.
* **finished** (its host ended before its session was opened): the outcome is the host's
  exit record (``dshd.execution.hosted.finished_outcome``) and the output read from the log.
  The result's ``message`` says dshd was not running when the command ended
  (:data:`~dshd.sessions.call_results.FINISHED_WHILE_DOWN`) only when the record's
  ``endedAt`` is before this daemon started (``plan.since``): a command that ended after the
  start, before its session opened or its host was re-attached, has no note. An adopted host
  still lingering after a command that ended before the start has the note too.
* **reask** (its approval was pending): ``CallTable.reask`` runs the usual pipeline with
  ``ApprovalDesk.reask`` as the gate (room asks).

The result is built by ``dshd.sessions.call_results`` with the sandbox completeness the first
daemon noted in ``host.json`` (``daemon.completeness``), and settled by the table as usual.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from protocol.lane import ToolResult

from ..agent.resume import resume_turn
from ..execution.hosted import HostHandle, adopt_hosted, finished_outcome
from ..execution.hostlink import host_record, record_on_disk
from ..storage.sidecar import PendingOutput
from . import call_results
from .call import Call
from .output import checkpoint_output

#: The call table (``dshd.sessions.calls.CallTable``; not imported: it imports this module).
CallTable = Any

__all__ = ["mark_dirs_settled", "mark_settled", "rebuild", "resume", "run_adopted"]

#: The empty file in a call's directory once its ``tool/result`` is durable (HOST.md §7).
SETTLED_MARKER = "settled"


async def resume(table: CallTable, plan, session) -> None:
    """Bring back the plan's calls (adopted, finished, re-asked) and turns
    (``resume_turn(session, plan.turn_events, turnId)`` as tasks of ``session``), then mark
    every other call dir settled (:func:`mark_dirs_settled`, a worker thread)."""
    if plan:
        for call_id, record in plan.adopt.items():
            table.adopt(call_id, record, None, plan.since)
        for call_id, exit_record in plan.finished.items():
            table.adopt(call_id, None, exit_record, plan.since)
        for call_id, approval_id in plan.reask.items():
            table.reask(call_id, approval_id)
        for turn_id in sorted(plan.turns):
            session.spawn(resume_turn, session, plan.turn_events, turn_id)
    await trio.to_thread.run_sync(mark_dirs_settled, table.dir / "calls", set(table.running))


def mark_settled(call_dir: Path) -> None:
    """Best effort: the empty ``settled`` file in a call's dir (``dshd.sessions.calls``). A
    lost one only makes the next daemon start open the session once and write it."""
    if os.path.islink(call_dir):
        return  # not a call dir of this session's (HOST.md §7): nothing is written through it
    try:
        os.close(os.open(call_dir / SETTLED_MARKER,
                         os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass


def mark_dirs_settled(calls_dir: Path, running: set[str]) -> None:
    """On open: mark every call dir settled whose call is not ``running`` -- its result is
    logged (repair wrote the lost ones' before the open) or its ``tool/call`` never became
    durable -- so the next start does not open the session again for it."""
    try:
        names = os.listdir(calls_dir)
    except OSError:
        return
    for name in names:
        if name not in running and not (calls_dir / name / SETTLED_MARKER).exists():
            mark_settled(calls_dir / name)


def rebuild(table: CallTable, call_id: str, stage: str, state: str) -> Call:
    """The logged call ``call_id`` as a running :class:`Call` at ``stage``, in the lane as
    ``state`` (module doc)."""
    logged = table.logged_calls[call_id]  # {seq, time, data} of its tool/call
    data = logged["data"]
    encoded = data.get("arguments") if isinstance(data.get("arguments"), str) else "{}"
    try:
        arguments = json.loads(encoded)
    except ValueError:
        arguments = {}
    if not isinstance(arguments, dict):
        arguments = {}
    call = Call(call_id, str(data.get("name", "")), arguments, False, int(logged["seq"]),
                stage=stage)  # type: ignore[arg-type]
    table.propose(call_id, call.name)
    table.running[call_id] = call
    table.enter_lane(call, encoded, state, int(logged.get("time") or 0))
    return call


async def run_adopted(table: CallTable, call: Call, record: dict | None,
                      exit_record: dict | None, since: float) -> ToolResult | None:
    """Run a re-adopted call to its result (``record``: its live host's ``host.json``), or
    settle one whose host ended before its session opened (``exit_record``); None when it was
    detached again by a daemon stop. ``since``: when this daemon started (the note)."""
    call_dir = table.call_dir(call.call_id)
    notes = (record or host_record(call_dir) or {}).get("daemon") or {}
    completeness = str(notes.get("completeness") or "full")
    assert call.capture is not None
    if exit_record is not None:
        outcome = await finished_outcome(
            call_dir, exit_record, capture=call.capture, on_output=table.lane.mark_dirty,
            segment_bytes=int((host_record(call_dir) or {}).get("segmentBytes") or 0),
            cwd=table.log.header.cwd)
        return call_results.outcome_result(
            call.call_id, call.arguments, call.capture, outcome, completeness,
            table.sandbox.name, table.stopping,
            note=call_results.while_down_note(exit_record, since))
    assert record is not None
    call.keeps = record.get("onDaemonLoss") == "keep"
    # A lingering host whose command ended while no daemon ran: its result says so.
    note = call_results.while_down_note(record_on_disk(call_dir), since)
    call.pending = PendingOutput(table.dir, call.call_id)

    def hosted(handle: HostHandle) -> None:
        call.host = handle

    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpoint_output, call, table.host.id)
        outcome = await adopt_hosted(
            call_dir, record, capture=call.capture, on_output=table.lane.mark_dirty,
            cancel=call.terminate, kill_grace=table.config.kill_grace_seconds,
            cwd=table.log.header.cwd, detach=call.detach, on_host=hosted)
        nursery.cancel_scope.cancel()
    if outcome.detached:
        return None
    return call_results.outcome_result(call.call_id, call.arguments, call.capture, outcome,
                                       completeness, table.sandbox.name, table.stopping, note)
