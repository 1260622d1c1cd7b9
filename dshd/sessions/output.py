"""The live output of a running call: its lane window and its pending-output checkpoints.

Theory of operation: a running call's ``OutputCapture`` (``dshd.execution.capture``) is
brought up to date from its call host's log by the runner (``dshd.execution.hosted``: at most
one read per progress burst; the window's totals are the host's). Its ``spill_path`` is the
call's ``calls/<callId>/output.raw`` once the output exceeded the window, and its truncation
carries ``droppedBytes`` once the per-call disk cap dropped some. Two consumers copy from it, each at its own pace and only when
its ``version`` changed: the lane (:func:`sync_output`, run by the publisher right before each
publish, so a flood of writes costs O(publishes)) and the pending-output sidecar
(:func:`checkpoint_output`, at most once per ``CHECKPOINT_SECONDS``; STORAGE.md §6), which
lets a daemon that is killed mid-call recover the output window on the next open.
"""

from __future__ import annotations

from typing import Protocol

import structlog
import trio

from protocol.codec import Encoder
from protocol.tracker import Tracker

from ..execution.capture import OutputCapture
from ..storage.errors import StorageError
from ..storage.sidecar import PendingOutput
from .lane import Lane

log = structlog.get_logger("dshd.session")

#: Pending-output sidecar checkpoints, at most one per call per this many seconds (STORAGE §6).
CHECKPOINT_SECONDS = 1.0


class Checkpointed(Protocol):
    """What :func:`checkpoint_output` reads of a running call."""

    call_id: str
    capture: OutputCapture | None
    pending: PendingOutput | None


class Running(Checkpointed, Protocol):
    """What :func:`sync_output` reads and writes of a running call (``calls.Call``)."""

    synced_version: int
    synced_spill: str | None


def sync_output(lane: Lane, call: Running) -> None:
    """Copy the call's capture onto the lane when it changed since the last copy."""
    lane.copy_output(call)


async def checkpoint_output(call: Checkpointed, session_id: str) -> None:
    """Checkpoint the call's ToolOutput to its sidecar at most once a second (STORAGE §6).

    Own tracker and encoder; a base batch first, after a failure, and whenever the sidecar
    asks for one (every 50 checkpoints), so recovery replays at most 50. Runs until cancelled.
    """
    cap, pending = call.capture, call.pending
    assert cap is not None and pending is not None
    tracker = Tracker(cap.tool_output())
    encoder = Encoder()
    last_version = -1
    while True:
        await trio.sleep(CHECKPOINT_SECONDS)
        if cap.version == last_version:
            continue
        last_version = cap.version
        tracker.set_text(["content", 0, "text"], cap.text)
        tracker.set(["truncation"], dict(cap.truncation))
        if cap.spill_path:
            tracker.set(["details", "spillPath"], cap.spill_path)
        if pending.needs_base:
            tracker.rebase()
        ops = tracker.flush()
        if not ops:
            continue
        try:
            await pending.checkpoint(encoder.encode(ops), base=ops[0][0] == "r")
        except StorageError as exc:
            log.warning("sidecar.checkpoint_failed", session=session_id, call=call.call_id,
                        error=str(exc))
            encoder = Encoder()
            tracker.rebase()
