"""The per-session summary: what `session.list` shows, cheap to read and checked against the log (STORAGE.md §7).

Theory of operation: ``summary.json`` is derived, never the truth. The writer rewrites it
(temp name + rename, 0600, no fsync) after each snapshot, at close, and at most every few
seconds while durable events are not in it; it records the header's title, cwd and
createdAt, the settings fold (`fold_settings`, the same pure fold the session uses), the
activity (``updatedAt``, ``lastExit``: `snapshot.activity_of`), the last seq, the log size it
covers (``logBytes``, a frame boundary) and the last snapshot's offset. A summary of an older
format (``v`` 1: no name, no activity) is not used: it is rebuilt from the last snapshot.

`read_summary` brings it up to date from the log: a summary is used only when it names this
session and a trailer ends at ``logBytes`` inside the log (a frame boundary; the frames
before it were verified by the writer or an open); the frames after ``logBytes`` (a
tail written since, e.g. before a crash) are read, verified and folded. Without a usable
summary it reads from the last snapshot (found by the trailer walk, `pages.last_snapshot`),
and a log without snapshots (an old one) whole. Damage is `LogCorrupt` (the caller lists the
session as damaged). It never writes.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import msgspec

from .errors import LogCorrupt, LogTooNew
from .format import LOG_NAME_PLAIN, LOG_NAME_ZSTD, TRAILER_HEAD, TRAILER_SIZE, Header
from .pages import LogView, forward, last_snapshot, read_header, snapshot_at
from .reader import find_log, parse_log
from .snapshot import (EMPTY_ACTIVITY, EMPTY_SETTINGS, SNAPSHOT_TYPE, activity_of,
                       base_activity, fold_settings, snapshot_settings)

__all__ = ["SUMMARY_NAME", "SessionSummary", "fold_settings", "read_summary",
           "summarising", "summary_dict", "summary_owner", "summary_snapshot_offset",
           "write_summary", "write_then_summarise"]

SUMMARY_NAME = "summary.json"
SUMMARY_VERSION = 2
_MAX_SUMMARY_BYTES = 64 * 1024


class SessionSummary(msgspec.Struct, frozen=True):
    """A session as `session.list` shows it (STORAGE.md §7). ``settings``: ``approvalPolicy``,
    ``sandbox``, ``owner``, ``name``, with the caller's defaults where the log never set one;
    ``activity``: ``updatedAt`` (ms or None: no event yet), ``lastExit``."""

    sessionId: str
    title: str | None
    cwd: str
    createdAt: int
    settings: dict
    lastSeq: int
    logBytes: int
    snapshotOffset: int | None
    activity: dict


class _Stored(SessionSummary, frozen=True):
    """``summary.json`` as written: a SessionSummary with its format version."""

    v: int


_decoder = msgspec.json.Decoder(_Stored)


def summary_dict(header: Header, settings: dict, last_seq: int, log_bytes: int,
                 snapshot_offset: int | None, activity: dict | None = None) -> dict:
    """The content of ``summary.json`` (STORAGE.md §7)."""
    return {"v": SUMMARY_VERSION, "sessionId": header.id, "title": header.title,
            "cwd": header.cwd, "createdAt": header.createdAt, "settings": dict(settings),
            "lastSeq": last_seq, "logBytes": log_bytes, "snapshotOffset": snapshot_offset,
            "activity": dict(activity or EMPTY_ACTIVITY)}


def write_summary(session_dir: Path, summary: dict) -> None:
    """Replace ``summary.json`` (temp + rename, 0600; no fsync: it is derived). Raises OSError."""
    data = msgspec.json.encode(summary)
    tmp = Path(session_dir) / f".{SUMMARY_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        os.rename(tmp, Path(session_dir) / SUMMARY_NAME)
    except OSError:
        os.unlink(tmp)
        raise


def _load(session_dir: Path | str, session_id: str) -> _Stored | None:
    try:
        fd = os.open(f"{session_dir}/{SUMMARY_NAME}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        stored = _decoder.decode(os.read(fd, _MAX_SUMMARY_BYTES + 1))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if (stored.v != SUMMARY_VERSION or stored.sessionId != session_id or stored.logBytes < 0
            or stored.settings.keys() != EMPTY_SETTINGS.keys()):
        return None
    return stored


def summary_snapshot_offset(session_dir: Path, session_id: str) -> int | None:
    """The ``snapshotOffset`` of a well-formed summary (unchecked against the log), or None."""
    stored = _load(session_dir, session_id)
    return None if stored is None else stored.snapshotOffset


def summary_owner(session_dir: Path, session_id: str) -> int | None:
    """The ``owner`` of a well-formed summary (unchecked against the log), or None."""
    stored = _load(session_dir, session_id)
    return None if stored is None else stored.settings.get("owner")


def _ends_frame(fd: int, at: int) -> bool:
    """True when a trailer ends at byte ``at`` naming a frame that starts inside the file."""
    if at < 2 * TRAILER_SIZE:
        return False
    trailer = os.pread(fd, TRAILER_SIZE, at - TRAILER_SIZE)
    return (len(trailer) == TRAILER_SIZE and trailer[:8] == TRAILER_HEAD
            and at - TRAILER_SIZE - int.from_bytes(trailer[8:12], "little") >= 0)


def read_summary(session_dir: Path, session_id: str, defaults: dict) -> SessionSummary:
    """The session's summary brought up to date from its log (module doc).

    ``defaults``: ``approvalPolicy``/``sandbox``/``owner`` for what the log never set.
    Raises `FileNotFoundError` (no log), `LogCorrupt`, `LogTooNew`, `OSError` (unreadable).
    """
    fd, path, compression = _open_log(session_dir, session_id)
    try:
        size = os.fstat(fd).st_size
        stored = _load(session_dir, session_id) if compression == "zstd" else None
        if stored is not None and stored.logBytes <= size and _ends_frame(fd, stored.logBytes):
            result = _brought_up(fd, size, stored, session_id, path)
        else:
            result = _from_log(fd, size, session_id, path, compression)
    finally:
        os.close(fd)
    settings = {k: (defaults.get(k) if v is None else v) for k, v in result.settings.items()}
    return msgspec.structs.replace(result, settings=settings)


def _open_log(session_dir: Path, session_id: str) -> tuple[int, Path | str, str]:
    """(read fd, path, compression) of the log; `reader.find_log`'s verdicts, with a fast
    path for the usual case (a zstd log and no plain one: two system calls)."""
    zst = f"{session_dir}/{LOG_NAME_ZSTD}"
    try:
        fd = os.open(zst, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    if fd is not None and not os.path.lexists(f"{session_dir}/{LOG_NAME_PLAIN}"):
        return fd, zst, "zstd"  # a str: a Path costs more than the read here
    if fd is not None:
        os.close(fd)
    path, compression = find_log(Path(session_dir), session_id)
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC), path, compression


def _brought_up(fd: int, size: int, stored: _Stored, session_id: str, path: Path
                ) -> SessionSummary:
    settings, last, snap = dict(stored.settings), stored.lastSeq, stored.snapshotOffset
    activity = stored.activity
    if size > stored.logBytes:
        view = LogView(fd, size, session_id, path)
        after = list(forward(view, stored.logBytes, stored.lastSeq + 1, True))
        for ev in after:
            if ev.type == SNAPSHOT_TYPE and ev.ignorable:
                snap = view.frame_pos
            settings = fold_settings(settings, ev)
            last = ev.seq
        activity = activity_of(activity, after)
    return SessionSummary(stored.sessionId, stored.title, stored.cwd, stored.createdAt,
                          settings, last, size, snap, activity)


def _from_log(fd: int, size: int, session_id: str, path: Path, compression: str
              ) -> SessionSummary:
    found = None
    if compression == "zstd" and size:
        view = LogView(fd, size, session_id, path)
        try:
            header, header_end, _ = read_header(view)
            found = last_snapshot(view, header_end)
        except (LogCorrupt, LogTooNew):
            found = None  # the whole read below names the damage
    if found is None:
        read = parse_log(os.pread(fd, size, 0), session_id=session_id, path=path,
                         compression=compression, fold=True)
        header, settings = read.header, read.settings
        last = read.events[-1].seq if read.events else (
            read.snapshot.seq if read.snapshot is not None else -1)
        base = base_activity(read.snapshot.data.get("session") if read.snapshot else None)
        return SessionSummary(session_id, header.title, header.cwd, header.createdAt,
                              settings, last, read.valid_bytes, read.snapshot_offset,
                              activity_of(base, read.events))
    offset, snap = found
    snapshot_at(view, offset)  # its trailer too
    settings, last = snapshot_settings(snap.data), snap.seq
    after = []
    for ev in forward(view, offset, snap.seq, True):
        if ev.seq > snap.seq:
            settings = fold_settings(settings, ev)
            last = ev.seq
            after.append(ev)
    return SessionSummary(session_id, header.title, header.cwd, header.createdAt, settings,
                          last, size, offset,
                          activity_of(base_activity(snap.data.get("session")), after))


def summarising(write, summary):
    """`write_then_summarise` of ``write`` and ``summary`` as a function of the payloads,
    named as ``write`` is (the worker thread is named after the work: ``append``,
    ``publish``)."""
    def work(payloads: list) -> OSError | None:
        return write_then_summarise(write, payloads, summary)
    work.__name__ = write.__name__
    return work


def write_then_summarise(write, payloads: list, summary) -> OSError | None:
    """``write(payloads)`` (raises), then, when asked, summary.json from ``summary(size)``:
    in the same worker thread, so the summary costs no extra hop; its failure is returned
    (it is derived: only logged)."""
    write(payloads)
    if summary is None:
        return None
    file = write.__self__
    try:
        write_summary(file.session_dir, summary(file.size))
    except OSError as e:
        return e
    return None
