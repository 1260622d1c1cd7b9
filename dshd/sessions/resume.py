"""The resume plan of a session opened after a daemon stop or crash (HOST.md §7, STORAGE.md §5).

Theory of operation: a call host outlives the daemon (``on_stop = "detach"``, or a crash), so
a ``tool/call`` without ``tool/result`` in a session's log no longer means "lost".
:func:`plan_resume` looks at each one, in log order, and at its call directory
``calls/<callId>/`` -- never at another session's files, never at a process it cannot tie to
the call:

(A call directory that is a symlink is read as empty; ``host.json`` and ``exit.json`` are read
by ``dshd.execution.hostlink``: regular files of the daemon's uid, bounded, well-formed.)

1. ``host.json`` names a live host: its pid runs with the same ``startTime`` (field 22 of
   ``/proc/PID/stat``) in the same boot, as the daemon's uid, with ``callhost/main.py`` in its
   argv (a reused pid is another process, so *not* alive) → **adopt**: the
   session re-attaches to the host and the call runs on (``dshd.execution.hosted.adopt_hosted``).
2. else ``exit.json`` is there → **finished**: the command ended while no daemon ran; the call
   settles from the record, with its real exit code and a note saying so.
3. else the call's ``approval/asked`` has no ``approval/decided`` → **reask**: the gate never
   let it through, nothing ran; the same ``approvalId`` is asked again (room asks).
4. else → the processes still carrying the run's token are SIGKILLed (a host killed while no
   daemon ran left its command unowned), and the call is repaired as before
   (``TOOL_OUTCOME_UNKNOWN`` with the last window, or
   ``TOOL_NOT_STARTED``; ``dshd.storage.repair``). Its window is the pending-output sidecar's,
   or, without one, the tail of the call's own log (:func:`tail_windows`).

The plan is made from the log's ``RepairState`` (``dshd.storage.repair``: the open calls and
approvals, folded incrementally; no event list). The turns that go on after the restart are
``dshd.agent.resume.resumable_turns`` of the calls that are resumed, over the events of the
most recently opened turn only (from its ``turn/start``; nothing older is read). Repair closes nothing the plan keeps (``keep_calls``, ``keep_approvals``,
``keep_turns``); the session then rebuilds the kept calls (``dshd.sessions.resumed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
import os
from pathlib import Path
from typing import Any

import structlog

from ..agent.resume import resumable_turns
from ..execution.capture import OutputCapture, ShellOutputLimits, catch_up
from ..execution.hostlink import (
    host_alive, host_record, log_reader, record_on_disk, scan_log, sweep_carriers,
)
from ..paths import is_valid_id
from ..storage.errors import StorageError
from ..storage.pages import read_events
from .resumed import SETTLED_MARKER

__all__ = ["ResumePlan", "plan_resume", "tail_windows", "turn_events", "unsettled_sessions"]

log = structlog.get_logger("dshd.registry")

#: Events per disk read of an open turn's events (``turn_events``).
TURN_PAGE_EVENTS = 10_000


@dataclass
class ResumePlan:
    """What a session resumes on open (module doc). ``adopt``: callId → ``host.json`` of its
    live host; ``finished``: callId → its exit record; ``reask``: callId → its approvalId;
    ``turns``: turnIds that go on; ``unknown``: calls repair closes ``TOOL_OUTCOME_UNKNOWN``
    or ``TOOL_NOT_STARTED``; ``windows``: callId → the last window read from a call's log
    (for repair, when no sidecar has one)."""

    adopt: dict[str, dict] = field(default_factory=dict)
    finished: dict[str, dict] = field(default_factory=dict)
    reask: dict[str, str] = field(default_factory=dict)
    turns: set[str] = field(default_factory=set)
    unknown: list[str] = field(default_factory=list)
    windows: dict[str, Any] = field(default_factory=dict)
    #: The events of the turn that resumes, from its ``turn/start`` on (``resume_turn``'s).
    turn_events: list[Any] = field(default_factory=list)
    #: Unix time this daemon started: a command that ended before it ended while no daemon ran
    #: (``dshd.sessions.call_results.while_down_note``). The registry sets it; unset, every
    #: exit record counts as one from while no daemon ran.
    since: float = float("inf")

    @property
    def keep_calls(self) -> frozenset[str]:
        return frozenset(self.adopt) | frozenset(self.finished) | frozenset(self.reask)

    @property
    def keep_approvals(self) -> frozenset[str]:
        return frozenset(self.reask.values())

    @property
    def keep_turns(self) -> frozenset[str]:
        return frozenset(self.turns)

    def __bool__(self) -> bool:
        return bool(self.adopt or self.finished or self.reask or self.turns)


def _unsettled(state: Any) -> tuple[list[str], dict[str, str]]:
    """callIds with ``tool/call`` and no ``tool/result`` (log order), and callId → the
    approvalId asked for it and never decided (the open calls and approvals of the
    ``RepairState``)."""
    pending: dict[str, str] = {}
    for aid, asked in state.open_approvals.items():
        cid = (asked.get("data") or {}).get("callId")
        if isinstance(cid, str):
            pending[cid] = aid
    return list(state.open_calls), pending


def plan_resume(state: Any, session_dir: Path,
                turn_events: Callable[[int], Iterable[Any]] | None = None) -> ResumePlan:
    """The session's :class:`ResumePlan` (module doc) from its ``RepairState`` (the log
    folded through its last event). Reads each unsettled call's ``host.json`` /
    ``exit.json`` and ``/proc``; ``turn_events(seq)``: the events from ``seq`` on (the most
    recently opened turn's, to tell whether it resumes; ``plan.turn_events`` keeps them).
    Synchronous (a worker thread)."""
    plan = ResumePlan()
    unsettled, pending = _unsettled(state)
    for cid in unsettled:
        call_dir = Path(session_dir) / "calls" / cid
        # A call dir that is a symlink is none of this call's (it may point at another
        # session's): nothing in it is read or adopted.
        real = call_dir.is_dir() and not call_dir.is_symlink()
        record = host_record(call_dir) if real else None
        if host_alive(record):
            plan.adopt[cid] = record  # type: ignore[assignment]
            continue
        exit_record = record_on_disk(call_dir) if real else None
        if exit_record is not None:
            plan.finished[cid] = exit_record
        elif cid in pending:
            plan.reask[cid] = pending[cid]
        else:
            # The host died without its record: what it left of the command must not run on
            # unowned (HOST.md §7; under bwrap the pid namespace took it down already).
            sweep_carriers(record)
            plan.unknown.append(cid)
    if state.open_turns and turn_events is not None:
        # Only the most recently started open turn can resume (dshd.agent.resume).
        plan.turn_events = list(turn_events(list(state.open_turns.values())[-1]))
        plan.turns = set(resumable_turns(plan.turn_events, plan.keep_calls))
    return plan


async def tail_windows(session_dir: Path, call_ids: Sequence[str],
                       limits: ShellOutputLimits) -> dict[str, Any]:
    """callId → the ToolOutput window of the tail of its call's log (``output.raw``), for the
    calls that left one: what ``TOOL_OUTCOME_UNKNOWN`` shows when no sidecar checkpointed it.
    A log that cannot be read gives no window (never an error)."""
    windows: dict[str, Any] = {}
    for cid in call_ids:
        call_dir = Path(session_dir) / "calls" / cid
        record = host_record(call_dir) or {}
        try:
            extent = scan_log(call_dir)
            if extent.end_offset <= 0:
                continue
            capture = OutputCapture(limits, call_dir / "output.raw")
            segment = int(record.get("segmentBytes") or extent.segment_bytes)
            await catch_up(capture, log_reader(call_dir, segment), extent.end_offset,
                           extent.first_offset, 0)
            capture.finish()
        except (OSError, ValueError):
            continue
        windows[cid] = capture.tool_output()
    return windows


def turn_events(session_dir: Path, session_id: str, seq: int) -> list:
    """The events from ``seq`` on (the open turn a resume plan looks at), read from disk and
    verified; [] when a frame there is damaged (the turn then does not resume: repair ends
    it ``interrupted``)."""
    out: list = []
    after = seq - 1
    try:
        while page := read_events(session_dir, session_id, after, TURN_PAGE_EVENTS):
            out += page
            after = page[-1].seq
    except StorageError as exc:
        log.warning("turn.events_unreadable", session=session_id, error=str(exc))
        return []
    return out


def unsettled_sessions(sessions_dir: Path) -> list[str]:
    """Session ids with a call dir (``<id>/calls/<callId>/``) that has no ``settled`` marker,
    sorted; no log is read (a worker thread at daemon start)."""
    found = set()
    try:
        session_ids = os.listdir(sessions_dir)
    except OSError:
        return []
    for session_id in session_ids:
        calls = sessions_dir / session_id / "calls"
        try:
            names = os.listdir(calls)
        except OSError:
            continue
        if is_valid_id(session_id) and any(
                not os.path.islink(calls / name) and os.path.isdir(calls / name)
                and not os.path.exists(calls / name / SETTLED_MARKER) for name in names):
            found.add(session_id)
    return sorted(found)
