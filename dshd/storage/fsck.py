"""The offline check of session logs: read each log, never write, and give its verdict (STORAGE.md §5).

Theory of operation: a session checked from its log alone is in one of a few states, each a
`Verdict`:

- ``ok``: the log reads clean and nothing is left open;
- ``needs-repair``: the log reads clean, but calls or approvals were left open: the closers
  the daemon would append when it opens the session (`repair.repair_closers`, pure) are
  listed, one label each. On a log a running dshd is writing, those are the calls still
  running (`daemon_holds` tells the caller to say so);
- ``torn``: the file ends inside its last frame; the complete records of that frame were
  recovered and the daemon trims the torn bytes on its next write -- nothing is lost that was
  durable (the closers it would append are listed too);
- ``damaged``: a complete frame is corrupt (checksum, JSON, seq gap: the byte offset is named),
  the log is missing or was written by a newer dshd. The daemon refuses to open it;
- ``unchecked``: the log could not be read (permissions, I/O error): neither good nor known bad.

`check_offline` only reads (`reader.read_log` never changes a file). `Verdict.failed`
(damaged, unchecked) decides the exit status of the command (`fsck_cli`). The online check --
what opening a session through dshd repaired -- is the client's (``dsh fsck`` without
``--offline``); the two share the verdict words and the closers' labels
(``protocol.events.closer_label``, re-exported here).
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.events import closer_label

from .errors import LogCorrupt, LogTooNew
from .reader import list_session_dirs, read_log, session_dir_for
from .repair import repair_closers

__all__ = ["Verdict", "check_offline", "closer_label", "daemon_holds", "offline_ids"]

@dataclass
class Verdict:
    session_id: str
    #: ok | torn | needs-repair | damaged | unchecked (the client's online check adds repaired)
    state: str
    #: Why it is damaged / unchecked (one line).
    reason: str | None = None
    #: What opening it would append (or, online, appended), one label each.
    repairs: list[str] = field(default_factory=list)
    #: The byte offset of the damage or of the torn tail.
    offset: int | None = None
    #: Torn: how many records were recovered from the torn frame.
    recovered: int | None = None
    #: True when ``repairs`` are closers still to be appended (not appended yet).
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
