"""A real ``dshd`` subprocess for benches: start, wait until it listens, measure, kill.

Theory of operation: :class:`BenchDaemon` owns one ``python -m dshd`` child with its socket and
state directory under one short ``/tmp`` directory (a Unix socket path is limited to 107
bytes), and an optional TOML config for limits. ``start`` polls (bounded) until the socket
accepts; ``stop`` sends SIGTERM, then SIGKILL after a bounded wait, and removes the directory.
It is a context manager, so every daemon a bench starts is stopped however the bench ends.
``peak_rss_kib`` / ``rss_kib`` read ``VmHWM`` / ``VmRSS`` from ``/proc/PID/status``.
``profile`` (optional) wraps the child in ``py-spy record`` and leaves the raw
(collapsed-stack) profile in a file for :func:`top_frames`.

:class:`StalledReader` is a raw subscriber that can stop reading on demand (small kernel
buffers, so that not reading really backs the daemon's writer up); it heals its own mirror
with ``protocol.mirror.Mirror`` when it reads again.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dshd.testing import end_hosts
from protocol.mirror import Mirror

__all__ = ["BenchDaemon", "StalledReader", "top_frames", "ROOT"]

ROOT = Path(__file__).resolve().parents[1]


class BenchDaemon:
    """One ``dshd`` child for the duration of a ``with`` block."""

    def __init__(self, config: dict | None = None, *, profile: Path | None = None,
                 prefix: str = "dsb-", root: Path = ROOT) -> None:
        self.root = root  # the source tree whose dshd runs (a baseline worktree, say)
        self.dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        self.socket = self.dir / "run" / "s"
        self.state_dir = self.dir / "state"
        self.work = self.dir / "work"
        self.work.mkdir()
        self.log_path = self.dir / "dshd.log"
        self.config = dict(config or {})
        self.profile = profile
        self.spy_args: list[str] = []  # e.g. ["--idle", "--threads"]
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None  # the daemon's pid (py-spy's child when profiling)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> "BenchDaemon":
        argv = [sys.executable, "-m", "dshd", "--socket", str(self.socket),
                "--state-dir", str(self.state_dir), "--log-format", "json",
                "--log-level", "warning"]
        if self.config:
            cfg = self.dir / "dshd.toml"
            cfg.write_text("".join(f"{k} = {_toml(v)}\n" for k, v in self.config.items()))
            argv += ["--config", str(cfg)]
        if self.profile is not None:
            spy = Path(sys.executable).with_name("py-spy")
            if not spy.exists():
                raise RuntimeError(f"--profile needs py-spy next to {sys.executable} "
                                   "(pip install py-spy; it is not a project dependency)")
            argv = [str(spy), "record", "--rate", "250", "--format", "raw", "--nonblocking", *self.spy_args,
                    "-o", str(self.profile), "--", *argv]
        env = dict(os.environ, PYTHONPATH=str(self.root))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, cwd=str(self.root))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # bounded readiness poll
            if self.proc.poll() is not None:
                raise RuntimeError(f"dshd exited {self.proc.returncode}: {self.log_path.read_text()}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                break
            except OSError:
                time.sleep(0.025)
        else:
            self.stop()
            raise RuntimeError(f"dshd did not listen within 20 s: {self.log_path.read_text()}")
        self.pid = self._daemon_pid()
        return self

    def _daemon_pid(self) -> int:
        assert self.proc is not None
        if self.profile is None:
            return self.proc.pid
        # py-spy forks the daemon: find the child whose command line is ours.
        for _ in range(200):
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    stat = (entry / "stat").read_text()
                    cmd = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid == self.proc.pid and b"dshd" in cmd:
                    return int(entry.name)
            time.sleep(0.01)
        raise RuntimeError("py-spy's dshd child not found")

    def stop(self) -> None:
        """SIGTERM, bounded wait, SIGKILL; then remove the directory. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            target = self.pid if self.profile is not None and self.pid else proc.pid
            try:
                os.kill(target, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(20 if self.profile is not None else 15)
            except subprocess.TimeoutExpired:
                if self.pid and self.pid != proc.pid:
                    try:
                        os.kill(self.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                proc.kill()
                proc.wait(5)
        end_hosts(self.state_dir)  # call hosts outlive a daemon that detaches (HOST.md §7)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "BenchDaemon":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- measuring -----------------------------------------------------------------------
    def _status_kib(self, key: str) -> int:
        assert self.pid is not None
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
        raise RuntimeError(f"no {key} in /proc/{self.pid}/status")

    def peak_rss_kib(self) -> int:
        return self._status_kib("VmHWM:")

    def rss_kib(self) -> int:
        return self._status_kib("VmRSS:")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the daemon so far (all its threads)."""
        assert self.pid is not None
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


class StalledReader:
    """A raw subscriber (blocking socket) that reads only when told to."""

    def __init__(self, path: Path, rcvbuf: int = 16384) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(str(path))
        self._buf = bytearray()
        self.mirror = Mirror()
        self.bases = 0
        self.batches = 0
        self.bytes = 0

    def _send(self, obj: object) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def _read(self) -> dict:
        """One line (a timeout leaves a partial line buffered for the next call)."""
        while (nl := self._buf.find(b"\n")) < 0:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("dshd closed the stalled reader's connection")
            self._buf += data
        line = bytes(self._buf[: nl + 1])
        del self._buf[: nl + 1]
        self.bytes += len(line)
        return json.loads(line)

    def subscribe(self, session_id: str) -> None:
        self._send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": 1, "client": {"name": "bench-stalled"}}})
        if "result" not in self._read():
            raise RuntimeError("initialize failed")
        self._send({"jsonrpc": "2.0", "id": 2, "method": "subscribe",
                    "params": {"sessionId": session_id}})
        while True:
            msg = self._read()
            if msg.get("id") == 2:
                if "result" not in msg:
                    raise RuntimeError(f"subscribe failed: {msg}")
                return

    def read_batch(self, timeout: float) -> dict | None:
        """Read one stream batch into the mirror (None on timeout)."""
        self.sock.settimeout(timeout)
        try:
            msg = self._read()
        except (socket.timeout, TimeoutError):
            return None
        finally:
            self.sock.settimeout(None)
        if msg.get("method") != "stream":
            return msg
        p = msg["params"]
        self.mirror.feed(p["seq"], p["ops"])  # raises MirrorBroken on a gap or a bad batch
        self.batches += 1
        if p["ops"] and p["ops"][0][0] == "r":
            self.bases += 1
        return msg

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


#: Leaf frames that are a thread waiting, not working: trio's epoll wait, an idle worker
#: thread waiting for a job (py-spy does not always recognise them as idle).
IDLE_LEAVES = ("EpollIOManager.get_events", "_thread_cache.py:211)")


def top_frames(raw_profile: Path, n: int = 12, *, own: bool = True) -> list[tuple[float, str]]:
    """The ``n`` heaviest functions of a py-spy raw (collapsed-stack) profile, as (share, frame).

    ``own``: self time (the leaf frame); else inclusive time (each frame counted once per
    sample). Samples taken while importing (daemon start) and waiting samples (``IDLE_LEAVES``)
    are left out, so the shares are of the time the daemon was busy.
    """
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw_profile.read_text().splitlines():
        stack, _, num = line.rpartition(" ")
        if not num.isdigit() or "_find_and_load" in stack:
            continue
        frames = stack.split(";")
        if any(idle in frames[-1] for idle in IDLE_LEAVES):
            continue
        k = int(num)
        total += k
        if own:
            counts[_short(frames[-1])] += k
        else:
            for f in {_short(f) for f in frames}:
                counts[f] += k
    if not total:
        return []
    return [(c / total, f) for f, c in counts.most_common(n)]


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py:123)"
    name, _, where = frame.partition(" (")
    if where:
        where = where.rstrip(")")
        where = os.path.basename(where.split(":")[0]) + (":" + where.split(":")[1] if ":" in where else "")
        return f"{name} ({where})"
    return name
