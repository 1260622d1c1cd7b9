"""The ``log/snapshot`` event and the settings fold (STORAGE.md §7); pure, no file system.

Theory of operation: a snapshot is a base checkpoint of folded state written into the log as
an ignorable event of its own frame, so a reader can start at the last one instead of at seq
0. Storage folds two things itself: the crash-repair state (`repair.RepairState`) and the
session's settings (`fold_settings`: ``approvalPolicy``, ``sandbox``, ``owner``, ``name`` as
logged, ``None`` when never logged; the daemon's defaults fill the gaps when a session is
listed). A snapshot written before names were logged has no ``name``
(`snapshot_settings` reads it as ``None``).
The owner adds its own state as an opaque dict (``session``), which storage never reads.
What a list shows of a session's activity -- ``updatedAt`` (the newest event's time) and
``lastExit`` (the newest ``tool/result``'s errorCode, else its exitCode) -- is `activity_of`
the events after a base: the owner's dict may carry it as ``activity`` (the daemon's does),
else its ``recent`` (newest first) gives ``lastExit``. `snapshot_data` builds the data of a
snapshot; `snapshot_problem` says why a decoded one is
not of that shape (damage).
"""

from __future__ import annotations

from typing import Any

from .format import Event
from .repair import RepairState

#: (type, data, ignorable) of the event the writer appends (data: `snapshot_data`).
SNAPSHOT_TYPE, _, SNAPSHOT_IGNORABLE = ("log/snapshot", None, True)
#: The settings of a session before any settings event (None: never logged).
EMPTY_SETTINGS: dict = {"approvalPolicy": None, "sandbox": None, "owner": None, "name": None}
#: The settings keys of a snapshot written before ``session/name`` existed.
_OLD_SETTINGS_KEYS = frozenset(EMPTY_SETTINGS) - {"name"}
_SETTINGS_OF = {"approval/policy": ("approvalPolicy", "policy"),
                "sandbox/mode": ("sandbox", "mode"), "session/owner": ("owner", "uid"),
                "session/name": ("name", "name")}


def snapshot_settings(data: dict) -> dict:
    """The settings a (checked) snapshot's ``data`` carries, every key of `EMPTY_SETTINGS`."""
    return {**EMPTY_SETTINGS, **data["settings"]}


def fold_settings(settings: dict, ev: Event) -> dict:
    """``settings`` after ``ev`` (pure: a new dict when ``ev`` changes it, else ``settings``).

    ``approval/policy`` sets ``approvalPolicy``, ``sandbox/mode`` sets ``sandbox``,
    ``session/owner`` sets ``owner``, ``session/name`` sets ``name`` (null: no name); a
    settings event without its key changes nothing.
    """
    which = _SETTINGS_OF.get(ev.type)
    if which is None:
        return settings
    key, field = which
    if field not in ev.data or settings.get(key) == ev.data[field]:
        return settings
    return {**settings, key: ev.data[field]}


def snapshot_data(*, through: int, offset: int, prev: int | None, repair: RepairState,
                  settings: dict, session: dict) -> dict:
    """The data of a ``log/snapshot`` written at byte ``offset`` (STORAGE.md §7)."""
    return {"through": through, "verifiedThrough": offset, "prev": prev,
            "repair": repair.to_json(), "settings": dict(settings), "session": session}


def snapshot_problem(data: Any, seq: int | None = None) -> str | None:
    """Why ``data`` is not a snapshot's data (None when it is): the words after "the snapshot
    at seq N" in a damage report."""
    if not isinstance(data, dict):
        return "is not an object"
    through, verified, prev = data.get("through"), data.get("verifiedThrough"), data.get("prev")
    if type(through) is not int or (seq is not None and through != seq - 1):
        return f"folds through {through!r}, not the event before it"
    if type(verified) is not int or verified < 0:
        return f"has a bad verifiedThrough {verified!r}"
    if prev is not None and (type(prev) is not int or not 0 <= prev < verified):
        return f"names a bad previous snapshot {prev!r}"
    settings = data.get("settings")
    if not isinstance(settings, dict) or set(settings) not in (set(EMPTY_SETTINGS),
                                                               _OLD_SETTINGS_KEYS):
        return "has bad settings"
    if not isinstance(data.get("session"), dict):
        return "has no session state"
    try:
        RepairState.from_json(data.get("repair"))
    except ValueError as e:
        return f"has a bad repair state ({e})"
    return None


#: A session's activity before any event (``updatedAt``: ms; ``lastExit``: int | str).
EMPTY_ACTIVITY: dict = {"updatedAt": None, "lastExit": None}


def result_exit(data: Any) -> int | str | None:
    """A ``tool/result``'s (or a ``recent`` entry's) exit: its errorCode, else its exitCode."""
    if not isinstance(data, dict):
        return None
    return data.get("errorCode") or data.get("exitCode")


def base_activity(session: Any) -> dict:
    """The activity an owner's snapshot dict carries (module doc); EMPTY_ACTIVITY when none."""
    if not isinstance(session, dict):
        return dict(EMPTY_ACTIVITY)
    stored = session.get("activity")
    if isinstance(stored, dict):
        return {"updatedAt": stored.get("updatedAt"), "lastExit": stored.get("lastExit")}
    recent = session.get("recent")
    last = result_exit(recent[0]) if isinstance(recent, list) and recent else None
    return {"updatedAt": None, "lastExit": last}


def activity_of(base: dict, events: list[Event]) -> dict:
    """``base`` (an activity) after ``events`` (oldest first; snapshots skipped), read from
    the newest back: it stops at the first ``tool/result``."""
    updated = exited = None
    found = False
    for ev in reversed(events):
        if ev.type == SNAPSHOT_TYPE:
            continue
        if updated is None:
            updated = ev.time
        if ev.type == "tool/result":
            exited, found = result_exit(ev.data), True
            break
    return {"updatedAt": base.get("updatedAt") if updated is None else updated,
            "lastExit": exited if found else base.get("lastExit")}
