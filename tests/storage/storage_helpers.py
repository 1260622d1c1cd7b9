"""Helpers shared by the storage tests (imported by name; conftest puts the root on sys.path)."""

from __future__ import annotations

from pathlib import Path

from dshd.storage import Header, SessionLog


def make_header(session_id: str = "s1", title: str | None = "a title") -> Header:
    return Header(id=session_id, createdAt=1_700_000_000_000, cwd="/srv/project", title=title)


async def write_log(
    state_dir: Path,
    batches: list[list[tuple[str, dict]]],
    *,
    session_id: str = "s1",
    compression: str = "zstd",
) -> Path:
    """Create a log whose frames are exactly ``batches`` (one flush each); return its path."""
    log = SessionLog.create(state_dir, session_id, make_header(session_id), compression=compression)
    if not batches:
        await log.flush()
    for batch in batches:
        for type_, data in batch:
            log.append(type_, data, time_ms=1_700_000_000_001)
        await log.flush()
    await log.aclose()
    return log.path


def turn_events(n: int, start: int = 0) -> list[tuple[str, dict]]:
    return [("turn/start", {"turnId": f"t{i}"}) for i in range(start, start + n)]
