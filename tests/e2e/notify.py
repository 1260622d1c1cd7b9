"""A real ``NOTIFY_SOCKET`` for tests: a bound AF_UNIX datagram socket that records every
sd_notify(3) message a daemon sends, each with the time it arrived."""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path


class NotifyListener:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        #: (monotonic arrival time, {field: value}) for every message received so far.
        self.messages: list[tuple[float, dict[str, str]]] = []

    def close(self) -> None:
        self.sock.close()

    def _receive(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.sock], [], [], max(timeout, 0))
        if not ready:
            return False
        data = self.sock.recv(65536).decode()
        fields = dict(line.split("=", 1) for line in data.splitlines() if "=" in line)
        self.messages.append((time.monotonic(), fields))
        return True

    def wait_for(self, predicate, timeout: float, since: int | None = None) -> dict[str, str]:
        """The first message (from index ``since``, default: from now on) for which
        ``predicate(fields)`` holds; AssertionError listing what arrived when none does
        within ``timeout`` seconds."""
        i = len(self.messages) if since is None else since
        deadline = time.monotonic() + timeout
        while True:
            while i < len(self.messages):
                fields = self.messages[i][1]
                i += 1
                if predicate(fields):
                    return fields
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching notify message within {timeout} s; got "
                                     f"{[m for _, m in self.messages][-20:]}")
            self._receive(left)

    def collect(self, seconds: float) -> list[dict[str, str]]:
        """Every message that arrives within the next ``seconds``."""
        start = len(self.messages)
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._receive(left)
        return [m for _, m in self.messages[start:]]
