"""Retention: pruning idle sessions, and keeping the state under ``max_state_bytes``.

Theory of operation (OPS.md "Retention", STORAGE.md §1):

* :func:`prune` is ``session.prune`` and the retention task's first half: every session the
  caller may delete whose ``updatedAt`` (the newest event's time; until SessionInfo carries
  it, the log file's mtime) is older than the cutoff is deleted through the registry
  (``SessionRegistry.delete``, never forced); a busy one is skipped (``busy``), one a client
  is subscribed to (``attached``: someone watches it), a damaged one (``damaged``: fsck it,
  then ``dsh rm`` it), and one whose delete failed (the failure's sentence). At most ``limit`` are deleted a request (``more`` says when it stopped
  there). ``dryRun`` deletes nothing and answers what would go.
* :func:`trim_outputs` is the second half: while the state directory (its apparent size as
  ``du -sb`` counts it, files and directories: ``deletion.tree_bytes``) is over ``max_state_bytes`` it removes settled calls' raw output (``output.raw``
  and its segments; a call is settled when its ``settled`` marker exists) oldest first, by
  the marker's mtime, at most :data:`REMOVE_PER_PASS` calls a pass. Before the first byte
  goes, the call dir gets ``output.removed`` (``{"at": ms, "bytes": n}``, written atomically
  and fsync'd), so the removal survives a restart and a crash in between is finished by the
  next pass. The log and the call's ``tool/result`` never change: only the raw bytes go.
  Reading them (``tool.read``, ``tool.follow``) answers :class:`OutputRemoved`. A pass that
  ends still over the bound counts what is left (``runningOutputBytes``: the output files of
  calls that have not settled, which are never removed while they run; the rest is logs,
  summaries and other files) and ``retention.over_bound`` says both (:func:`over_bound_hint`).
* :func:`run` is the daemon task: a pass at start (after the calls that outlived the last
  daemon are back), every ``retention_interval_seconds``, and sooner when settled output may
  have filled what was left under ``max_state_bytes``: every call that settles tells the
  :class:`RetentionNudge` its ``totalBytes``, and once they add up to the headroom the last
  pass left (at least ``1/NUDGE_SHARE`` of the bound) the task wakes, at most one pass every
  :data:`MIN_PASS_SECONDS`. So a bound holds between passes to within the output of the
  calls running meanwhile, not an hour of output; each pass is bounded
  (:data:`DELETE_PER_PASS` sessions, :data:`REMOVE_PER_PASS` outputs), the walk runs in a
  worker thread, and a pass that fails is logged and retried at the next one.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import structlog
import trio

from ..callhost.spec import write_json
from ..errors import DshError, InvalidParams
from ..paths import is_valid_id
from ..storage.errors import StorageError
from .deletion import SessionBusy, tree_bytes

log = structlog.get_logger("dshd.retention")

__all__ = ["DELETE_PER_PASS", "OUTPUT_REMOVED", "PRUNE_MAX", "REMOVE_PER_PASS", "OutputRemoved",
           "RetentionNudge", "check_output", "over_bound_hint", "prune", "run", "trim_outputs"]

#: The marker of a call whose raw output retention removed (in its call dir).
OUTPUT_REMOVED = "output.removed"
#: Sessions one ``session.prune`` request deletes at most (``more``: ask again).
PRUNE_MAX = 1_000
#: Sessions one retention pass deletes at most; outputs one pass removes at most.
DELETE_PER_PASS = 64
REMOVE_PER_PASS = 1_024
_LOG_NAMES = ("session.v1.jsonl.zst", "session.v1.jsonl")
#: A nudged pass comes once settled output reaches the headroom, at least this share of the
#: bound (1/NUDGE_SHARE); and never sooner than MIN_PASS_SECONDS after the last pass.
NUDGE_SHARE = 32
MIN_PASS_SECONDS = 5.0


class RetentionNudge:
    """Settled output since the last pass against the headroom it left (module doc)."""

    def __init__(self) -> None:
        self.since = 0
        self.headroom: int | None = None  # None: no pass has measured the state yet
        self.woken = trio.Event()

    def written(self, total_bytes: int) -> None:
        """A call settled with ``total_bytes`` of output (``CallTable``'s hook)."""
        self.since += max(0, total_bytes)
        if self.headroom is not None and self.since >= self.headroom:
            self.woken.set()

    def passed(self, state_bytes: int, max_bytes: int) -> None:
        """A pass measured ``state_bytes``: the headroom starts again from there."""
        self.since, self.woken = 0, trio.Event()
        self.headroom = max(max_bytes - state_bytes, max_bytes // NUDGE_SHARE, 1)


class OutputRemoved(InvalidParams):
    """Reading a call whose output retention removed (``-32602`` ``OUTPUT_REMOVED``)."""

    def __init__(self, session_id: str, call_id: str, at_ms: int) -> None:
        when = datetime.fromtimestamp(at_ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        super().__init__(
            f"the output of call {call_id} was removed by max_state_bytes on {when}; its "
            f"result is still in the log (dsh log {session_id})",
            code="OUTPUT_REMOVED", removedAt=at_ms)


def removed_at(call_dir: Path) -> int | None:
    """When the call's output was removed (ms), or None when it was not."""
    try:
        with open(call_dir / OUTPUT_REMOVED, "rb") as f:
            return int(json.loads(f.read(4096)).get("at", 0))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return 0  # a marker that does not read: the output is still gone


async def check_output(call_dir: Path, session_id: str, call_id: str) -> None:
    """Raise :class:`OutputRemoved` when the call's raw output was removed."""
    at = await trio.to_thread.run_sync(removed_at, call_dir)
    if at is not None:
        raise OutputRemoved(session_id, call_id, at)


def _updated_ms(sessions_dir: Path, info: dict) -> int:
    if info.get("updatedAt"):
        return int(info["updatedAt"])
    for name in _LOG_NAMES:
        try:
            return int(os.stat(sessions_dir / info["sessionId"] / name).st_mtime * 1000)
        except OSError:
            continue
    return int(info.get("createdAt") or 0)


async def prune(registry, older_than: float, *, dry_run: bool,
                may_delete: Callable[[int | None], bool], by: int | None, why: str,
                limit: int = PRUNE_MAX) -> dict:
    """``session.prune`` (module doc): ``{"deleted", "skipped", "freedBytes", "more"}``."""
    cutoff = time.time() * 1000 - older_than * 1000
    infos = await registry.list()
    deleted: list[str] = []
    skipped: list[dict] = []
    freed = 0
    more = False
    for info in infos:
        sid = info["sessionId"]
        if "cwd" not in info:  # listed as damaged only: its owner is unknown
            continue
        if not may_delete(info.get("owner")):
            continue
        if _updated_ms(registry.sessions_dir, info) >= cutoff:
            continue
        if info.get("damaged"):
            skipped.append({"sessionId": sid, "reason": "damaged"})
            continue
        if len(deleted) >= limit:
            more = True
            break
        open_ = registry.opened(sid)
        if open_ is not None and open_.subscriptions():
            skipped.append({"sessionId": sid, "reason": "attached"})
            continue
        if dry_run:
            if info.get("running"):
                skipped.append({"sessionId": sid, "reason": "busy"})
                continue
            deleted.append(sid)
            freed += await trio.to_thread.run_sync(tree_bytes, registry.sessions_dir / sid)
            continue
        try:
            done = await registry.delete(sid, force=False, by=by, why=why)
        except SessionBusy:
            skipped.append({"sessionId": sid, "reason": "busy"})
            continue
        except (DshError, StorageError, OSError) as exc:
            skipped.append({"sessionId": sid, "reason": str(exc)[:200]})
            continue
        deleted.append(sid)
        freed += done["freedBytes"]
    return {"deleted": deleted, "skipped": skipped, "freedBytes": freed, "more": more}


def _settled_outputs(sessions_dir: Path) -> list[tuple[float, Path, list[Path]]]:
    """[(settled marker's mtime, call dir, output files)] of the settled calls that still
    have output files (a half-done removal included), oldest first."""
    candidates = []
    for call_dir in sessions_dir.glob("*/calls/*"):
        if not is_valid_id(call_dir.parent.parent.name):  # a tombstone being removed
            continue
        try:
            settled = os.stat(call_dir / "settled").st_mtime
        except OSError:
            continue
        files = sorted(call_dir.glob("output.raw*"))
        if files:
            candidates.append((settled, call_dir, files))
    candidates.sort(key=lambda c: (c[0], str(c[1])))
    return candidates


def _running_output_bytes(sessions_dir: Path) -> int:
    """Bytes of the output files of calls that have not settled (never removed)."""
    total = 0
    for call_dir in sessions_dir.glob("*/calls/*"):
        if not is_valid_id(call_dir.parent.parent.name) or (call_dir / "settled").exists():
            continue
        for f in call_dir.glob("output.raw*"):
            try:
                total += f.stat().st_size
            except OSError:
                continue  # settled and removed meanwhile
    return total


def trim_outputs(state_dir: Path, max_bytes: int, limit: int = REMOVE_PER_PASS) -> dict:
    """Remove settled calls' output oldest first until the state is under ``max_bytes``
    (module doc). Blocking (a worker thread). ``{"removed", "freedBytes", "stateBytes",
    "runningOutputBytes"}`` (the last counted only when still over, else 0)."""
    total = tree_bytes(state_dir)
    removed = freed = 0
    if total <= max_bytes:
        return {"removed": 0, "freedBytes": 0, "stateBytes": total, "runningOutputBytes": 0}
    for _mtime, call_dir, files in _settled_outputs(Path(state_dir) / "sessions"):
        if total <= max_bytes or removed >= limit:
            break
        size = sum(f.stat().st_size for f in files if f.exists())
        try:
            if not (call_dir / OUTPUT_REMOVED).exists():
                write_json(str(call_dir), OUTPUT_REMOVED,
                           {"at": time.time_ns() // 1_000_000, "bytes": size}, durable=True)
            for f in files:
                f.unlink(missing_ok=True)
        except OSError as exc:  # a session deleted meanwhile, a full disk: the next pass
            log.warning("retention.output_remove_failed", call_dir=call_dir.name, error=str(exc))
            continue
        removed += 1
        freed += size
        total -= size
    running = _running_output_bytes(Path(state_dir) / "sessions") if total > max_bytes else 0
    return {"removed": removed, "freedBytes": freed, "stateBytes": total,
            "runningOutputBytes": running}


def over_bound_hint(done: dict, max_bytes: int) -> str:
    """What ``retention.over_bound`` says of a pass that left the state over ``max_bytes``
    with no settled output to remove: what it counted, and what a person can do."""
    running = done.get("runningOutputBytes", 0)
    rest = max(done["stateBytes"] - running, 0)
    return (f"no settled call's output is left to remove, and the state is "
            f"{done['stateBytes']} bytes, over max_state_bytes {max_bytes}: {running} bytes "
            f"are running calls' output (never removed while they run) and {rest} bytes are "
            "logs, summaries and other files; wait for the running calls, prune sessions "
            "(dsh prune) or lower retain_sessions_days")


async def one_pass(registry, config) -> None:
    """One retention pass (module doc)."""
    if config.retain_sessions_days > 0:
        done = await prune(registry, config.retain_sessions_days * 86_400, dry_run=False,
                           may_delete=lambda _owner: True, by=None,
                           why="retain_sessions_days", limit=DELETE_PER_PASS)
        if done["deleted"]:
            log.info("retention.pruned", sessions=len(done["deleted"]),
                     freed_bytes=done["freedBytes"], more=done["more"])
    if config.max_state_bytes > 0:
        done = await trio.to_thread.run_sync(trim_outputs, registry.state_dir,
                                             config.max_state_bytes)
        registry.retention.passed(done["stateBytes"], config.max_state_bytes)
        if done["removed"]:
            log.info("retention.output_removed", calls=done["removed"],
                     freed_bytes=done["freedBytes"], state_bytes=done["stateBytes"])
        if done["stateBytes"] > config.max_state_bytes and done["removed"] < REMOVE_PER_PASS:
            log.warning("retention.over_bound", state_bytes=done["stateBytes"],
                        max_state_bytes=config.max_state_bytes,
                        running_output_bytes=done["runningOutputBytes"],
                        hint=over_bound_hint(done, config.max_state_bytes))


async def run(registry, config) -> None:
    """The retention task (module doc): a pass now, then one every interval or when the
    settled output nudges it."""
    while True:
        try:
            await one_pass(registry, config)
        except Exception as exc:  # noqa: BLE001 - one failed pass must not end the daemon
            log.error("retention.pass_failed", error=str(exc))
        rest = min(MIN_PASS_SECONDS, config.retention_interval_seconds)
        await trio.sleep(rest)
        with trio.move_on_after(config.retention_interval_seconds - rest):
            await registry.retention.woken.wait()
