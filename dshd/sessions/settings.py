"""A session's settings changes made durable, or taken back (``dshd.sessions.session``).

Theory of operation: settings (approval policy, sandbox mode, env, owner) change in memory and
on the lane only after their event is durable. :func:`record_durably` appends the change's
events and waits -- shielded: a disconnect must not leave memory and log apart -- until they
are durable. When that fails the change is taken back before the storage error reaches the
caller: the events are retracted while they are still the unwritten tail of the log
(``SessionLog.retract``), else the ``undo`` events (the old values) are appended to the same
buffered batch, so the retry that finally writes it leaves the settings as they were. ``fold``
sees every event appended (change or undo), as the log has it: what the session's next
snapshot says (``dshd.sessions.logview``).
"""

from __future__ import annotations

from typing import Any, Callable

import trio

from ..storage.errors import StorageError

__all__ = ["record_durably"]

Change = list[tuple[str, dict, bool]]


async def record_durably(log_: Any, change: Change, undo: Change,
                         fold: Callable[[str, dict], None]) -> int:
    """Append ``change`` (``(type, data, ignorable)``) and make it durable (module doc); the
    last seq. StorageError after taking the change back; its ``retracted`` attribute is True
    when the events left the log (``fold`` saw them: the caller undoes its fold)."""
    first = last = -1
    for type_, data, ignorable in change:
        last = log_.append(type_, data, ignorable=ignorable).seq
        first = last if first < 0 else first
        fold(type_, data)
    try:
        with trio.CancelScope(shield=True):
            await log_.wait_durable(last)
    except StorageError as exc:
        if log_.retract(first, last):
            exc.retracted = True  # type: ignore[attr-defined]
        else:
            for type_, data, ignorable in undo:
                log_.append(type_, data, ignorable=ignorable)
                fold(type_, data)
        raise
    return last
