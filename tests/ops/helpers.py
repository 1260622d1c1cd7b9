"""Shared by room ops' restart tests: a line reader with a liveness bound, and the `dsh` CLI's
environment for a daemon."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

#: Generous liveness bound for one line of output (the machine is shared).
LIVENESS = 90.0
DSH = [sys.executable, "-m", "client.cli"]


def dsh_env(daemon) -> dict:
    return dict(os.environ, DSH_SOCKET=str(daemon.socket), DSH_STATE_DIR=str(daemon.state_dir))


class Lines:
    """The stdout of a process, line by line, read on a thread so that waits are bounded."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.seen: list[bytes] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            self._queue.put(line)
        self._queue.put(None)

    def next(self, timeout: float = LIVENESS) -> bytes | None:
        """The next line; None at end of file. Fails after ``timeout`` without one."""
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output line within {timeout} s; so far: {self.seen[-5:]}")
        if line is not None:
            self.seen.append(line)
        return line

    def until(self, predicate, timeout: float = LIVENESS) -> bytes:
        while True:
            line = self.next(timeout)
            assert line is not None, f"end of output before the line looked for: {self.seen[-5:]}"
            if predicate(line):
                return line

    def rest(self, timeout: float = LIVENESS) -> list[bytes]:
        out = []
        while (line := self.next(timeout)) is not None:
            out.append(line)
        return out


def copy_tree(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst
