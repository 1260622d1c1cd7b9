"""The intact events of a damaged log: what comes before the first damaged frame (STORAGE.md §5).

Theory of operation: a log with a damaged frame is never opened for writing, and a read that
reaches the frame fails (`LogCorrupt`); but every frame before it was verified by its own
checksum, so its events are the truth up to there. :func:`read_intact` reads like
`pages.read_events` -- from the newest snapshot at or before the first seq asked for (from
the first frame when the snapshot walk itself meets the damage) -- and stops at the damage,
returning the events it verified and the damage (None when it met none). Snapshots are left
out (as ``session.events`` leaves them out). Sync: call it in a worker thread; read only.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import LogCorrupt
from .format import Event
from .pages import LogView, forward, read_header, start_for
from .reader import find_log, parse_log
from .snapshot import SNAPSHOT_TYPE

__all__ = ["read_intact"]


def read_intact(session_dir: Path, session_id: str, after_seq: int, limit: int
                ) -> tuple[list[Event], LogCorrupt | None]:
    """(up to ``limit`` verified events with seq > ``after_seq``, the damage that ended the
    read or None) (module doc). Raises FileNotFoundError (no log), LogTooNew, OSError."""
    path, compression = find_log(Path(session_dir), session_id)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    out: list[Event] = []
    try:
        size = os.fstat(fd).st_size
        if compression == "none":  # plain logs (debugging): read whole, or not at all
            try:
                read = parse_log(os.pread(fd, size, 0), session_id=session_id, path=path,
                                 compression="none")
            except LogCorrupt as exc:
                return [], exc
            return [e for e in read.events if e.seq > after_seq][:limit], None
        view = LogView(fd, size, session_id, path)
        try:
            _, header_end, trailers = read_header(view)
        except LogCorrupt as exc:
            return [], exc
        try:
            start, seq = start_for(view, header_end, max(after_seq + 1, 0), None)
        except LogCorrupt:
            start, seq = header_end, 0  # the snapshot walk met the damage: from the start
        try:
            for ev in forward(view, start, seq, trailers or start > header_end):
                if ev.seq > after_seq and ev.type != SNAPSHOT_TYPE:
                    out.append(ev)
                    if len(out) >= limit:
                        break
        except LogCorrupt as exc:
            return out, exc
        return out, None
    finally:
        os.close(fd)
