"""End-to-end fixtures: a real ``dshd`` process on a real Unix socket, killed at teardown."""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dshd.testing import DshdProcess


class DaemonProcess(DshdProcess):
    """``dshd.testing.DshdProcess`` plus what the end-to-end tests ask of it: the environment
    for the real ``dsh`` CLI, its peak RSS, and a restart."""

    def __init__(self, root: Path, extra_args: list[str] | None = None) -> None:
        super().__init__(root, extra_args=extra_args)
        self.env = dict(os.environ, DSH_SOCKET=str(self.socket), DSH_STATE_DIR=str(self.state_dir))

    def peak_rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise RuntimeError("no VmHWM")

    def restart(self) -> None:
        self.stop()
        self.start()

    def dsh(self, *args: str, cwd: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run the real ``dsh`` CLI against this daemon."""
        return subprocess.run(
            [sys.executable, "-m", "client.cli", *args], env=self.env, cwd=cwd,
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )


@contextlib.contextmanager
def running_daemon(config: str = "", extra_args: tuple[str, ...] = (), prefix: str = "dsh-e2e-"):
    """A started :class:`DaemonProcess` in a fresh directory, with ``config`` (TOML text) as its
    config file when given; stopped and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    args = list(extra_args)
    if config:
        cfg = root / "dshd.toml"
        cfg.write_text(config)
        args = ["--config", str(cfg), *args]
    d = DaemonProcess(root, args or None)
    try:
        d.start()
        yield d
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def daemon():
    with running_daemon() as d:
        yield d


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


@contextlib.contextmanager
def throwaway_user(name: str, *, system: bool = False, keep: bool = False,
                   tools: tuple[str, ...] = ("useradd", "userdel", "setpriv")):
    """The unprivileged user ``name`` (created when missing, removed afterwards unless it
    existed or ``keep``), or a skip when this run cannot create users. Tolerates another
    pytest-xdist worker creating the same user at the same moment (useradd exit 9)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create an unprivileged test user")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not available")
    created = False
    try:
        pwd.getpwnam(name)
    except KeyError:
        cmd = ["useradd", *(["--system"] if system else []), "--no-create-home",
               "--shell", "/usr/sbin/nologin", name]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode not in (0, 9):
            raise RuntimeError(f"useradd {name}: {done.stderr.strip()}")
        created = done.returncode == 0 and not keep
    try:
        yield pwd.getpwnam(name)
    finally:
        if created:
            subprocess.run(["userdel", name], check=False, capture_output=True)


def until(predicate, what: str, bound: float = 30.0):
    """Poll ``predicate`` until it is truthy (its value) -- a generous liveness bound on "it
    happens", never a speed target."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {bound} s: {what}")


@contextlib.contextmanager
def daemon_with_nofile(nofile: int, config: str = ""):
    """A started ``DaemonProcess`` in a temporary root whose RLIMIT_NOFILE is ``nofile`` (set
    in the child only: ``subprocess.Popen`` gets a ``preexec_fn`` for this one start), with
    ``config`` as its dshd.toml when given; closed and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="dsh-fd-"))
    args: list[str] = []
    if config:
        (root / "dshd.toml").write_text(config)
        args = ["--config", str(root / "dshd.toml")]
    d = DaemonProcess(root, args) if args else DaemonProcess(root)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    orig_popen = subprocess.Popen

    def popen(*a, **kwargs):
        kwargs["preexec_fn"] = limit
        return orig_popen(*a, **kwargs)

    subprocess.Popen = popen  # only for this start; restored at once
    try:
        d.start()
    finally:
        subprocess.Popen = orig_popen
    try:
        yield d
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)
