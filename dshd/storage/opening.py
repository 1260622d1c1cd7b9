"""What `writer.SessionLog.open_for_write` does after the read: repair, sidecars, the old view (STORAGE.md §5).

Theory of operation: once the log is read from its last snapshot (`pages.open_read`), the
handle holds the crash-repair fold through the last event (`RepairState`). `repair_on_open`
asks the owner's resume plan (``plan(state)``; the deprecated ``resume(events)`` reads the
whole log once), appends the closers `repair.repair_closers` gives for that state (one
shared ``time``) and flushes them. `retire_settled_sidecars` unlinks the pending-output
sidecars of calls that are not open any more (their ``tool/result`` is durable: a result
still waiting for the torn-tail fix is not). `compat_events` builds the deprecated
``SessionLog.events`` list (disk before the tail, then the tail).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .format import Event, now_ms
from .memory import PendingSnapshot
from .pages import iter_all
from .repair import DEFAULT_LIMITS, repair_closers, unresolved_calls
from .sidecar import PENDING_DIR, SUFFIX, pending_windows, retire_settled
from .threads import run_sync

#: A `writer.SessionLog` (not imported: the writer imports this module).
SessionLog = Any


async def repair_on_open(log: SessionLog, limits: tuple[int, int] | None, resume, plan_of
                         ) -> None:
    """The resume plan, then the crash closers, flushed (module doc)."""
    if plan_of is not None:
        plan = await plan_of(log.repair_state)
    else:
        plan = await resume(log.events) if resume is not None else None
    log.resume_plan = plan
    state = log.repair_state.copy()
    windows = await run_sync(pending_windows, log.session_dir, unresolved_calls(state))
    if plan is not None:
        windows = {**plan.windows, **windows}  # a checkpointed window wins
    keep = {} if plan is None else {"keep_calls": plan.keep_calls, "keep_turns": plan.keep_turns,
                                    "keep_approvals": plan.keep_approvals}
    at = now_ms()
    for type_, data in repair_closers(state, windows, limits or DEFAULT_LIMITS, **keep):
        log.append(type_, data, time_ms=at)
    if log.durable_seq < log.last_seq:
        await log.flush()


def _sidecar_ids(session_dir: Path) -> list[str]:
    try:
        names = os.listdir(session_dir / PENDING_DIR)
    except OSError:
        return []
    return [n[: -len(SUFFIX)] for n in names if n.endswith(SUFFIX)]


async def retire_settled_sidecars(log: SessionLog) -> None:
    """Unlink the sidecars of calls that are not open (their result is durable)."""
    unsure = {ev.data.get("callId") for ev in log.tail
              if ev.seq > log.durable_seq and ev.type == "tool/result"}
    open_calls = log.repair_state.calls
    settled = [cid for cid in await run_sync(_sidecar_ids, log.session_dir)
               if cid not in open_calls and cid not in unsure]
    if settled:
        await run_sync(retire_settled, log.session_dir, settled)


def compat_events(log: SessionLog) -> list[Event]:
    """Every event of ``log`` in seq order: the disk before the tail, then the tail and the
    pending snapshots (placeholders: their offsets are not known yet)."""
    newer = list(log.tail) + [p.event(-1) for _, p, _ in log._pending
                              if isinstance(p, PendingSnapshot)]
    newer.sort(key=lambda ev: ev.seq)
    first = newer[0].seq if newer else log.last_seq + 1
    disk: list[Event] = []
    if log.durable_bytes and first > 0:
        disk = [ev for ev in iter_all(log.session_dir, log.session_id) if ev.seq < first]
    return disk + newer
