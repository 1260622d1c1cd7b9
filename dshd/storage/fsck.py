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
- ``damaged``: a complete frame is corrupt (checksum, JSON, seq gap, a ``log/snapshot`` that
  disagrees with the fold of the frames before it: the byte offset is named),
  the log is missing or was written by a newer dshd. The daemon refuses to open it;
- ``unchecked``: the log could not be read (permissions, I/O error): neither good nor known bad.

`check_offline` only reads (`reader.read_log` never changes a file); it reads every frame,
snapshots included, and keeps in memory only the events after the last snapshot. `Verdict.failed`
(damaged, unchecked) decides the exit status of the command (`fsck_cli`). The online check --
what opening a session through dshd repaired -- is the client's (``dsh fsck`` without
``--offline``); the two share the verdict words and the closers' labels
(``protocol.events.closer_label``, re-exported here).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from protocol.events import closer_label
from protocol.verdicts import Verdict

from .errors import LogCorrupt, LogTooNew
from .reader import list_session_dirs, read_log, session_dir_for
from .repair import repair_closers

__all__ = ["Verdict", "check_offline", "closer_label", "daemon_holds", "offline_ids"]


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
        read = read_log(directory, session_id, fold=True, check=True)
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
    closers = [label for type_, data in repair_closers(read.repair)
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
