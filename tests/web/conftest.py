"""Shared fixtures of the web tests: a real ``dshd`` and a real ``dsh web`` subprocess.

``web_daemon`` is a started ``tests.e2e.conftest.DaemonProcess`` (a ``DshdProcess`` with
``.env`` and ``.dsh(...)`` for the real CLI) in a fresh directory, closed at the end.
``bridge`` is a started :class:`WebBridge` on that daemon's socket: ``dsh web --listen
127.0.0.1:0 --socket S --token-file F``; ``.url`` the tokened URL it printed, ``.base``
``http://127.0.0.1:PORT``, ``.port``, ``.token``, ``.log`` its stderr so far, ``.stop()``
(SIGTERM, wait), ``.kill()`` (SIGKILL), ``.start()`` again on the SAME port and token file.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from dshd.testing import end_process
from tests.e2e.conftest import running_daemon, until  # noqa: F401 - until: for web tests

URL_RE = re.compile(r"(http://\S+/\?token=\S+)")
START_TIMEOUT_S = 30.0


class WebBridge:
    """One real ``dsh web`` subprocess (module doc); always reaped by :meth:`close`."""

    def __init__(self, socket: Path, token_file: Path, *, listen: str = "127.0.0.1:0",
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 prefix: tuple[str, ...] = ()) -> None:
        self.socket = Path(socket)
        self.token_file = Path(token_file)
        self.listen = listen
        self.extra_args = list(extra_args)
        self.env = dict(env if env is not None else os.environ)
        self.prefix = list(prefix)  # e.g. ("setpriv", "--reuid", ...) to run as another user
        self.proc: subprocess.Popen | None = None
        self.url = self.base = self.token = ""
        self.port = 0
        self._err: list[str] = []
        self._reader: threading.Thread | None = None

    def command(self, *more: str) -> list[str]:
        return [*self.prefix, sys.executable, "-m", "client.cli", "web", "--listen", self.listen,
                "--socket", str(self.socket), "--token-file", str(self.token_file),
                *self.extra_args, *more]

    def start(self, *more: str, timeout: float = START_TIMEOUT_S) -> str:
        """Start (again: on the same port once one was picked); wait for the URL line."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if self.port:
            self.listen = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            self.command(*more), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=self.env, cwd=Path(__file__).parents[2])
        self._reader = threading.Thread(target=self._read_err, args=(self.proc,), daemon=True)
        self._reader.start()
        line = self._read_url(timeout)
        self.url = URL_RE.search(line).group(1)
        self.base = self.url.split("/?token=")[0]
        self.token = self.url.split("/?token=")[1]
        self.port = int(self.base.rsplit(":", 1)[1])
        return self.url

    def _read_url(self, timeout: float) -> str:
        box: list[str] = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not box or not URL_RE.search(box[0]):
            self.kill()
            raise RuntimeError(f"dsh web printed no URL within {timeout} s: {box!r}\n{self.log}")
        return box[0]

    def _read_err(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self._err.append(line)

    @property
    def log(self) -> str:
        return "".join(self._err)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit status."""
        return self._end(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        return self._end(signal.SIGKILL, 10.0)

    def _end(self, sig: int, timeout: float) -> int | None:
        if self.proc is None:
            return None
        rc = end_process(self.proc, sig, timeout)
        if self._reader is not None:
            self._reader.join(5)
        self.proc.stdout.close()
        return rc

    def close(self) -> None:
        if self.running:
            self.stop()


@pytest.fixture
def web_daemon():
    with running_daemon(prefix="dsh-web-") as d:
        yield d


@pytest.fixture
def bridge(web_daemon):
    root = Path(tempfile.mkdtemp(prefix="dsh-webb-"))
    b = WebBridge(web_daemon.socket, root / "tok" / "web-token")
    try:
        b.start()
        yield b
    finally:
        b.close()
        shutil.rmtree(root, ignore_errors=True)

