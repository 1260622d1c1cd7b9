"""The verdicts of ``dsh fsck`` (STORAGE.md §5), online through dshd or offline from the logs.

Theory of operation: a session is in one of a few states, each a ``Verdict``:

- ``ok``: the log reads clean (and, online, opening it appended nothing);
- ``repaired`` (online): opening it for write appended crash closers. ``session.list`` reads
  logs without opening them, so its ``lastSeq`` against the one of ``session.get`` (which opens
  the session, and repairs it) says whether anything was appended; ``repairs_in`` reads the new
  events and names the closers: ``TOOL_OUTCOME_UNKNOWN`` / ``TOOL_NOT_STARTED`` results,
  approvals decided ``by: repair``, turns ended ``interrupted`` (and, with those, closed steps).
  New events without any closer are live activity: the session is ``ok``;
- ``torn`` (offline): the file ends inside its last frame; the complete records of that frame
  were recovered and the daemon trims the torn bytes on its next write -- nothing is lost that
  was durable;
- ``damaged``: a complete frame is corrupt (checksum, JSON, seq gap: the byte offset is named),
  the log is missing or written by a newer dshd. The daemon refuses to open it;
- ``unchecked`` (online): the daemon could not open it for another reason (locked by another
  process, the open-session limit): neither good nor known bad.

Offline, a clean log with unclosed calls or approvals is ``needs-repair``: the closers the
daemon would append on open (``dshd.storage.repair.repair_closers``, pure) are listed (a torn
log lists them too). On a log a running dshd is writing, those are the calls still running.
``check_offline`` only reads (``dshd.storage.reader.read_log`` never changes a file).
``Verdict.failed`` (damaged, unchecked) decides the exit status of ``dsh fsck``.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from dshd.storage.errors import LogCorrupt, LogTooNew
from dshd.storage.reader import list_session_dirs, read_log, session_dir_for
from dshd.storage.repair import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, repair_closers

__all__ = ["Verdict", "repairs_in", "closer_label", "check_offline", "offline_ids",
           "daemon_holds"]

REPAIR_CODES = (TOOL_OUTCOME_UNKNOWN, TOOL_NOT_STARTED)


@dataclass
class Verdict:
    session_id: str
    #: ok | repaired | torn | needs-repair | damaged | unchecked
    state: str
    #: Why it is damaged / unchecked (one line).
    reason: str | None = None
    #: What opening it appended (online) or would append (offline), one label each.
    repairs: list[str] = field(default_factory=list)
    #: Offline: the byte offset of the damage or of the torn tail.
    offset: int | None = None
    #: Offline, torn: how many records were recovered from the torn frame.
    recovered: int | None = None
    #: Offline: True when ``repairs`` are closers still to be appended (not appended yet).
    pending: bool = False

    @property
    def failed(self) -> bool:
        return self.state in ("damaged", "unchecked")

    def text(self) -> str:
        """The verdict in one line (without the session id)."""
        if self.state in ("damaged", "unchecked"):
            return f"{self.state}: {self.reason}"
        parts: list[str] = []
        if self.state == "torn":
            parts.append(f"torn tail at byte {self.offset}: {_records(self.recovered or 0)} "
                         "recovered (the daemon drops the torn bytes on its next write)")
        elif self.state == "repaired":
            parts.append("repaired: " + ", ".join(self.repairs))
        elif self.state != "needs-repair":
            parts.append("ok")
        if self.pending and self.repairs:
            parts.append("needs repair on open: " + ", ".join(self.repairs))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sessionId": self.session_id, "state": self.state}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.repairs:
            out["needsRepair" if self.pending else "repairs"] = list(self.repairs)
        if self.offset is not None:
            out["offset"] = self.offset
        if self.recovered is not None:
            out["recovered"] = self.recovered
        return out


def _records(n: int) -> str:
    return f"{n} record" + ("" if n == 1 else "s")


def closer_label(type_: str, data: Any) -> str | None:
    """A short label for a crash closer (``None`` when the event is not one)."""
    if not isinstance(data, dict):
        return None
    if type_ == "tool/result" and data.get("errorCode") in REPAIR_CODES:
        return f"call {data.get('callId')} {data['errorCode']}"
    if type_ == "approval/decided" and data.get("by") == "repair":
        return f"approval {data.get('approvalId')} {data.get('outcome', 'cancelled')}"
    if type_ == "turn/end" and data.get("reason") == "interrupted":
        return f"turn {data.get('turnId')} interrupted"
    return None


def repairs_in(events: Iterable[dict[str, Any]]) -> list[str]:
    """Labels of the crash closers among ``events`` (session.events objects), in order.

    A ``step/end`` is a closer only beside other closers: steps also end normally.
    """
    labels: list[str] = []
    steps: list[str] = []
    for event in events:
        type_, data = event.get("type"), event.get("data")
        label = closer_label(str(type_), data)
        if label is not None:
            labels.append(label)
        elif type_ == "step/end" and isinstance(data, dict):
            steps.append(f"step {data.get('stepId')} closed")
    return labels + steps if labels else []


# ---------------------------------------------------------------------- offline
def offline_ids(state_dir: Path, session_id: str | None) -> list[str]:
    """The sessions to check: ``session_id`` or every session directory of ``state_dir``.

    Raises ``FileNotFoundError`` when ``state_dir`` (or the named session) does not exist and
    ``ValueError`` for an invalid session id.
    """
    state_dir = Path(state_dir)
    if not state_dir.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such state directory", str(state_dir))
    if session_id is None:
        return list_session_dirs(state_dir)
    directory = session_dir_for(state_dir, session_id)  # ValueError for a bad id
    if not directory.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"no session {session_id}", str(directory))
    return [session_id]


def check_offline(state_dir: Path, session_id: str) -> Verdict:
    """Read one session's log directly (never writes) and judge it."""
    directory = session_dir_for(Path(state_dir), session_id)
    try:
        read = read_log(directory, session_id)
    except FileNotFoundError:
        return Verdict(session_id, "damaged", "no log file (created but never written)")
    except LogCorrupt as exc:
        return Verdict(session_id, "damaged", f"{exc.path} is damaged at byte {exc.offset}: "
                       f"{exc.reason}", offset=exc.offset)
    except LogTooNew as exc:
        return Verdict(session_id, "damaged", f"{exc.path} was written by a newer dshd: "
                       f"upgrade ({exc.detail}, at byte {exc.offset})", offset=exc.offset)
    except OSError as exc:
        return Verdict(session_id, "unchecked", f"cannot read the log: {exc.strerror or exc}")
    closers = [label for type_, data in repair_closers(read.events)
               if (label := closer_label(type_, data)) is not None]
    if read.torn:
        return Verdict(session_id, "torn", offset=read.valid_bytes,
                       recovered=len(read.recovered), repairs=closers, pending=True)
    return Verdict(session_id, "needs-repair" if closers else "ok", repairs=closers, pending=True)


def daemon_holds(state_dir: Path) -> bool:
    """True when a dshd holds ``<state_dir>/dshd.lock`` (probed with a shared, non-blocking
    flock on a read-only descriptor: nothing is written, nothing is kept)."""
    try:
        fd = os.open(Path(state_dir) / "dshd.lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
