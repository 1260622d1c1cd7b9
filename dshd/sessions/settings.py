"""A session's settings changes made durable, or taken back (``dshd.sessions.session``).

Theory of operation: settings (approval policy, sandbox mode, env, owner, name) change in
memory and on the lane only after their event is durable; :class:`SessionSettings` holds the
session's methods that change them (``Session`` is one), this module's function does the
durable part. :func:`record_durably` appends the change's
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

import structlog
import trio

from ..storage.errors import StorageError

log = structlog.get_logger("dshd.sessions")

__all__ = ["SessionSettings", "record_durably"]

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


class SessionSettings:
    """The settings methods of ``dshd.sessions.session.Session`` (module doc); they use its
    ``_log``, ``_lane``, ``_logged_env`` and the settings attributes."""

    async def record_settings(
        self, *, policy: str, mode: str, env: dict, source: str, owner: int | None = None,
        name: str | None = None,
    ) -> None:
        """Record a new session's owner, name, policy, sandbox mode and env durably, then
        apply and show them. Raises StorageError, changing nothing (see `_record_durably`)."""
        change: list[tuple[str, dict, bool]] = []
        undo: list[tuple[str, dict, bool]] = []
        if owner is not None:
            change.append(("session/owner", {"uid": owner}, True))
            undo.append(("session/owner", {"uid": self.owner}, True))
        if name is not None:
            change.append(("session/name", {"name": name}, True))
            undo.append(("session/name", {"name": self.name}, True))
        change.append(("approval/policy", {"policy": policy, "source": source}, False))
        undo.append(("approval/policy", {"policy": self.policy, "source": "rollback"}, False))
        change.append(("sandbox/mode", {"mode": mode, "source": source}, False))
        undo.append(("sandbox/mode", {"mode": self.mode, "source": "rollback"}, False))
        if env:
            change.append(("session/env", {"env": dict(env)}, True))
            undo.append(("session/env", {"env": dict(self.env)}, True))
        await self._record_durably(change, undo)
        if owner is not None:
            self.owner = owner
        if name is not None:
            self.name = name
        if env:
            self.env = dict(env)
        self.policy = policy
        self.mode = mode
        self._lane.show_settings(policy=policy, sandbox=mode)
        if name is not None:
            self._lane.show_name(name)

    async def set_policy(self, policy: str, source: str) -> None:
        """Change the approval policy once the change is durable; StorageError changes
        nothing (PROTOCOL.md: -32014 and the old policy stays)."""
        seq = await self._record_durably(
            [("approval/policy", {"policy": policy, "source": source}, False)],
            [("approval/policy", {"policy": self.policy, "source": "rollback"}, False)],
        )
        if seq < self._policy_seq:
            return  # a later change became durable with us and already applied
        self._policy_seq = seq
        self.policy = policy
        self._lane.show_settings(policy=policy)

    async def set_sandbox(self, mode: str, source: str, by: int | None = None) -> None:
        """Change the sandbox mode of the calls confined from now on (a running command keeps
        the confinement it started with) once the change is durable; StorageError changes
        nothing (-32014, the old mode stays), as set_policy. ``by``: the caller's uid (in the
        event, and the ``session.sandbox_changed`` daemon log line)."""
        data: dict[str, Any] = {"mode": mode, "source": source}
        if by is not None:
            data["by"] = by
        before = self.mode
        seq = await self._record_durably(
            [("sandbox/mode", data, False)],
            [("sandbox/mode", {"mode": self.mode, "source": "rollback"}, False)],
        )
        log.info("session.sandbox_changed", session=self.id, **{"from": before}, to=mode, by=by)
        if seq < self._mode_seq:
            return  # a later change became durable with us and already applied
        self._mode_seq = seq
        self.mode = mode
        self._lane.show_settings(sandbox=mode)

    async def set_name(self, name: str | None) -> None:
        """Give the session ``name`` (None: no name) once the change is durable; StorageError
        changes nothing. Uniqueness is the registry's (``SessionRegistry.rename``)."""
        await self._record_durably([("session/name", {"name": name}, True)],
                                   [("session/name", {"name": self.name}, True)])
        self.name = name
        self._lane.show_name(name)

    async def _record_durably(
        self, change: list[tuple[str, dict, bool]], undo: list[tuple[str, dict, bool]]
    ) -> int:
        """``dshd.sessions.settings.record_durably``; the env as logged follows the log."""
        def fold(type_: str, data: dict) -> None:
            if type_ == "session/env":  # the next snapshot's env (the writer folds the rest)
                self._logged_env = dict(data.get("env") or {})

        before = self._logged_env
        try:
            return await record_durably(self._log, change, undo, fold)
        except StorageError as exc:
            if getattr(exc, "retracted", False):
                self._logged_env = before
            raise
