"""End-to-end fixtures: a real ``dshd`` process on a real Unix socket, killed at teardown."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest


class DaemonProcess:
    """One ``dshd`` subprocess with its own socket and state dir (both under a short /tmp dir,
    since a Unix socket path is limited to 107 bytes)."""

    def __init__(self, root: Path, extra_args: list[str] | None = None) -> None:
        self.root = root
        self.socket = root / "run" / "dshd.sock"  # the daemon creates run/ (0700)
        self.state_dir = root / "state"
        self.log_path = root / "dshd.log"
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self.env = dict(os.environ, DSH_SOCKET=str(self.socket), DSH_STATE_DIR=str(self.state_dir))

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dshd", "--log-format", "json", *self.extra_args],
            env=self.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )
        log.close()
        for _ in range(400):  # bounded readiness poll, not a timing assertion
            if self.proc.poll() is not None:
                raise RuntimeError(f"dshd exited {self.proc.returncode}: {self.log_path.read_text()}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                return
            except OSError:
                time.sleep(0.025)
        raise RuntimeError(f"dshd did not listen: {self.log_path.read_text()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def peak_rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise RuntimeError("no VmHWM")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        rc = self.proc.returncode
        self.proc = None
        return rc

    def restart(self) -> None:
        self.stop()
        self.start()

    def dsh(self, *args: str, cwd: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run the real ``dsh`` CLI against this daemon."""
        return subprocess.run(
            [sys.executable, "-m", "client.cli", *args], env=self.env, cwd=cwd,
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )


@pytest.fixture
def daemon():
    root = Path(tempfile.mkdtemp(prefix="dsh-e2e-"))
    d = DaemonProcess(root)
    d.start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def workdir(tmp_path):
    w = tmp_path / "work"
    w.mkdir()
    return w


def live_processes_matching(needle: str) -> list[int]:
    """Pids (not zombies) whose command line contains ``needle`` (works across pid namespaces)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z" and entry.name != str(os.getpid()):
            found.append(int(entry.name))
    return found


def wait_until_gone(needle: str, attempts: int = 200) -> list[int]:
    """Poll (bounded) until no live process matches; returns what is left."""
    left = live_processes_matching(needle)
    for _ in range(attempts):
        if not left:
            break
        time.sleep(0.05)
        left = live_processes_matching(needle)
    return left
