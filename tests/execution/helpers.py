"""Process helpers for the execution tests."""

from __future__ import annotations

import os

import trio


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (PID 1 in a container may not reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def wait_dead(pid: int, tries: int = 500) -> bool:
    """Poll (by count, not by time) until ``pid`` is gone; a SIGKILLed process may still be
    finishing its exit when the pipe reports end of file."""
    for _ in range(tries):
        if not alive(pid):
            return True
        await trio.sleep(0.01)
    return False
