"""Test support: a real ``dshd`` subprocess (like ``trio.testing``, shipped with the package so
that the tests, the crash campaign and the benchmarks share one launcher).

Theory of operation: :class:`DshdProcess` starts ``python -m dshd`` with its socket under a
short directory (``sun_path`` is 107 bytes), waits, bounded, until the socket accepts, and
always reaps what it started: ``stop`` signals and waits, SIGKILL after a bound; ``kill9``
simulates a crash. Call hosts outlive the daemon (HOST.md §7: a stop *detaches* them), so
:meth:`DshdProcess.close` is how a test or bench ends a daemon for good: it stops the daemon,
then ends every call host under its state directory (``hostlink.end_host``: the pid and
``startTime`` of ``host.json``, TERM to the command, its grace, KILL). A restart test uses
``stop()`` / ``kill9()`` + ``start()`` and ``close()`` at the end. It is not used by the
daemon itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def end_process(proc: subprocess.Popen, sig: int, timeout: float) -> int:
    """Send ``sig`` to a live ``proc``, wait ``timeout`` s, then SIGKILL (waited 10 s); its
    exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


class DshdProcess:
    """One ``dshd`` subprocess on ``<root>/run/dshd.sock`` (short path: sun_path is 107 bytes)
    with its state in ``state_dir`` (default ``<root>/state``) and its log in ``<root>/dshd.log``.
    """

    def __init__(
        self,
        root: Path,
        *,
        state_dir: Path | None = None,
        socket_path: Path | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.socket = socket_path or self.root / "run" / "dshd.sock"
        self.state_dir = state_dir or self.root / "state"
        self.log_path = self.root / "dshd.log"
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "dshd", "--log-format", "json",
            "--socket", str(self.socket), "--state-dir", str(self.state_dir), *self.extra_args,
        ]

    def spawn(self) -> subprocess.Popen:
        """Start the process without waiting for it to listen."""
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                env=dict(os.environ, DSH_SOCKET=str(self.socket), DSH_STATE_DIR=str(self.state_dir)),
            )

    def start(self, timeout: float = 20.0) -> None:
        """Start and wait (bounded) until the socket accepts a connection."""
        assert self.proc is None, "already started"
        self.proc = self.spawn()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                rc, self.proc = self.proc.returncode, None
                raise RuntimeError(f"dshd exited {rc} at start:\n{self.log_tail()}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                return
            except OSError:
                time.sleep(0.01)
        self.kill9()
        raise RuntimeError(f"dshd did not listen within {timeout} s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL and reap (no-op when not running)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal (graceful by default), wait bounded, SIGKILL if needed; the exit status."""
        if self.proc is None:
            return None
        rc, self.proc = end_process(self.proc, sig, timeout), None
        return rc

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill_hosts(self) -> int:
        """SIGKILL every live call host under the state directory with its command tree, as
        a machine crash would (no ``exit.json``): the calls' outcome is really unknown."""
        return kill_hosts(self.state_dir)

    def close(self, sig: int = signal.SIGTERM) -> int:
        """Stop the daemon (:meth:`stop`), then end every call host under the state directory
        (module doc); returns how many live hosts were ended."""
        self.stop(sig)
        return end_hosts(self.state_dir)


def end_hosts(state_dir: Path) -> int:
    """End every live call host under ``state_dir`` (``sessions/*/calls/*/host.json``);
    how many there were."""
    from dshd.execution.hostlink import end_host

    ended = 0
    for call_dir in sorted(Path(state_dir).glob("sessions/*/calls/*")):
        if (call_dir / "host.json").exists():
            ended += end_host(call_dir)
    return ended


def kill_hosts(state_dir: Path) -> int:
    """SIGKILL every live call host under ``state_dir`` and its command's tree (the run's
    token carriers too); how many hosts there were."""
    from dshd.callhost import tree
    from dshd.execution.hostlink import host_alive, host_record

    killed = 0
    for call_dir in sorted(Path(state_dir).glob("sessions/*/calls/*")):
        record = host_record(call_dir)
        if not host_alive(record):
            continue
        assert record is not None
        os.kill(record["pid"], signal.SIGKILL)
        marker = f"{record.get('tokenVar')}={record.get('token')}"
        tree.kill_tree(record["pid"], None, None, marker, int(record.get("uid", os.geteuid())))
        killed += 1
    return killed
