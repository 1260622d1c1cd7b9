"""Escape suite: real commands try to leave the sandbox; every attempt is judged on the host.

Each case is a bash script run confined in the workspace of an *arena* (a directory under
/var/tmp, not /tmp, so that bwrap's private /tmp is not what stops it) and a check that looks at
the host afterwards: did a file appear or change outside, did a listener receive a connection
or a datagram (loopback delivery is synchronous, so a non-blocking accept/recv after the command
exited is exact — no timing), did the output carry a secret, did ``kill`` succeed.

* ``test_escape_suite`` — provider ∈ {bwrap, landlock} × mode ∈ {read-only, workspace-write}:
  no contract case escapes; for landlock the cases listed in :data:`LANDLOCK_GAPS` (things
  Landlock cannot stop) are reported separately and must be named by the provider's reason.
* ``test_danger_full_access_escapes`` — the control: unconfined, every case escapes, which shows
  the checks can see an escape at all.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from dshd.execution.sandbox import NoSandbox, SandboxUnavailable

from .conftest import ESCAPE_REPORT
from .helpers import run_confined

#: Cases Landlock cannot stop (see dshd.execution.sandbox_landlock), with the words of its
#: reason that declare each one.
LANDLOCK_GAPS = {
    "read_hidden_state": "state directory",
    "chmod_outside": "chmod",
    "utime_outside": "utime",
}


@dataclass
class Case:
    name: str
    script: str
    escaped: Callable[[str], bool]  # output text -> did it get out?
    #: Also hide the state dir and socket *inside* the workspace (cwd = HOME, issue 10 item 3).
    inner: bool = False


class Arena:
    """Workspace, outside files, fake state dir, listeners and target processes for one run."""

    def __init__(self, root: Path) -> None:
        self.marker = f"dsh-escape-{uuid.uuid4().hex[:10]}"
        self.root = root
        self.ws = root / "ws"
        self.outside = root / "outside"
        self.state = root / "state"
        self.ws.mkdir(parents=True)
        self.outside.mkdir()
        (self.state / "sessions" / "other" / "spill").mkdir(parents=True)
        (self.state / "sessions" / "mine").mkdir(parents=True)
        self.secret = f"SECRET-{self.marker}"
        self.other_log = self.state / "sessions" / "other" / "log.zst"
        self.other_log.write_text(self.secret + "\n")
        (self.state / "sessions" / "other" / "spill" / "c1.log").write_text(self.secret + "\n")
        self.victim = self.outside / "victim"
        self.victim.write_text("original\n")
        self.victim_mode = stat.S_IMODE(self.victim.stat().st_mode)
        self.victim_mtime = self.victim.stat().st_mtime_ns
        (self.ws / "link").symlink_to(self.outside)
        (self.ws / "flink").symlink_to(self.victim)
        (self.ws / "movable").write_text("move me\n")
        # A state dir and a socket inside the workspace, as with cwd = HOME (issue 10 item 3).
        self.inner_state = self.ws / ".local" / "state" / "dsh"
        self.inner_state.mkdir(parents=True)
        (self.inner_state / "log").write_text(self.secret + "\n")
        self.inner_sock_path = self.ws / ".local" / "run" / "dshd.sock"
        self.inner_sock_path.parent.mkdir()
        self.inner_sock = socket.socket(socket.AF_UNIX)
        self.inner_sock.bind(str(self.inner_sock_path))
        self.inner_sock.listen(16)
        self.inner_sock.setblocking(False)
        self.printk = Path("/proc/sys/kernel/printk_ratelimit")
        self.printk_value = self.printk.read_text().strip()
        self.host = {
            "home": Path(os.environ.get("HOME", "/root")) / f".{self.marker}",
            "etc": Path("/etc") / self.marker,
            "var_tmp": Path("/var/tmp") / self.marker,
            "tmp": Path("/tmp") / self.marker,
            "dev_shm": Path("/dev/shm") / self.marker,
        }
        self.tcp = socket.create_server(("127.0.0.1", 0), backlog=16)
        self.tcp.setblocking(False)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.setblocking(False)
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind(f"\0{self.marker}")
        self.abstract.listen(16)
        self.abstract.setblocking(False)
        self.unix_path = self.state / "ctl.sock"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(str(self.unix_path))
        self.unix.listen(16)
        self.unix.setblocking(False)
        # A host IPC socket in /run (D-Bus, systemd, docker live there): not in ``hide``.
        self.run_path = Path("/run") / f"{self.marker}.sock"
        self.run_sock = socket.socket(socket.AF_UNIX)
        self.run_sock.bind(str(self.run_path))
        self.run_sock.listen(16)
        self.run_sock.setblocking(False)
        env = dict(os.environ, DSH_TEST_SECRET=self.secret)
        self.environ_target = subprocess.Popen(["sleep", "300"], env=env)
        self.signal_target = subprocess.Popen(["sleep", "300"])

    @property
    def hide(self) -> list[str]:
        return [str(self.state)]

    @property
    def inner_hide(self) -> list[str]:
        return [str(self.state), str(self.inner_state), str(self.inner_sock_path)]

    def close(self) -> None:
        for sock in (self.tcp, self.udp, self.abstract, self.unix, self.run_sock,
                     self.inner_sock):
            sock.close()
        self.run_path.unlink(missing_ok=True)
        for proc in (self.environ_target, self.signal_target):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for path in self.host.values():
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def _accepted(sock: socket.socket) -> bool:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    def _received(self) -> bool:
        try:
            self.udp.recv(100)
        except BlockingIOError:
            return False
        return True

    def _exists_outside(self, name: str) -> bool:
        return os.path.lexists(self.outside / name)

    def _victim_changed(self) -> bool:
        return self.victim.read_text() != "original\n"

    def cases(self) -> list[Case]:
        m, out, st, py = self.marker, self.outside, self.state, sys.executable
        caps_script = "grep -E '^Cap(Eff|Prm):' /proc/self/status"
        host = self.host

        def host_file(path: Path) -> Callable[[str], bool]:
            return lambda text: os.path.lexists(path)

        def caps_held(text: str) -> bool:
            values = [line.split()[1] for line in text.splitlines() if line.startswith("Cap")]
            return len(values) != 2 or any(int(v, 16) for v in values)

        connect_py = (  # argv[1]: a socket path, or "@name" for an abstract one
            "import socket,sys; a=sys.argv[1]; s=socket.socket(socket.AF_UNIX); "
            "s.connect(chr(0)+a[1:] if a[0]=='@' else a); print('CONNECTED')"
        )
        return [
            Case("home", f'echo x > "$HOME/.{m}"', host_file(host["home"])),
            Case("etc", f"echo x > /etc/{m}", host_file(host["etc"])),
            Case("var_tmp", f"echo x > /var/tmp/{m}", host_file(host["var_tmp"])),
            Case("host_tmp", f"echo x > /tmp/{m}", host_file(host["tmp"])),
            Case("dev_shm", f"echo x > /dev/shm/{m}", host_file(host["dev_shm"])),
            Case(
                "other_session",
                f'echo pwn >> "{self.other_log}"; echo x > "{st}/sessions/other/spill/{m}"',
                lambda t: self.other_log.read_text() != self.secret + "\n"
                or os.path.lexists(st / "sessions" / "other" / "spill" / m),
            ),
            Case("state_dir", f'echo x > "{st}/{m}"; mkdir "{st}/d-{m}"',
                 lambda t: os.path.lexists(st / m) or os.path.lexists(st / f"d-{m}")),
            Case("symlink_dir", f"echo x > link/sym-{m}",
                 lambda t: self._exists_outside(f"sym-{m}")),
            Case("symlink_file", "echo pwn >> flink", lambda t: self._victim_changed()),
            Case("dotdot", f"echo x > ../outside/dd-{m}; echo x > \"{self.ws}/../outside/dd2-{m}\"",
                 lambda t: self._exists_outside(f"dd-{m}") or self._exists_outside(f"dd2-{m}")),
            Case("proc_self_root", f'echo x > "/proc/self/root{out}/ps-{m}"',
                 lambda t: self._exists_outside(f"ps-{m}")),
            Case("proc_pid_root",  # through the root of a process outside the sandbox
                 f'echo x > "/proc/{self.signal_target.pid}/root{out}/pp-{m}"',
                 lambda t: self._exists_outside(f"pp-{m}")),
            Case("hardlink", f'ln "{self.victim}" hl-{m} && echo pwn >> hl-{m}',
                 lambda t: self._victim_changed()),
            Case("rename_out", f'mv movable "{out}/moved-{m}"',
                 lambda t: self._exists_outside(f"moved-{m}")),
            Case("truncate", f': > "{self.victim}"', lambda t: self._victim_changed()),
            Case("mkdir_outside", f'mkdir "{out}/dir-{m}"',
                 lambda t: self._exists_outside(f"dir-{m}")),
            Case("tcp_connect",
                 f"exec 3<>/dev/tcp/127.0.0.1/{self.tcp.getsockname()[1]} && echo CONNECTED",
                 lambda t: self._accepted(self.tcp) or "CONNECTED" in t),
            Case("abstract_unix_socket", f'{py} -c "{connect_py}" "@{m}"',
                 lambda t: self._accepted(self.abstract) or "CONNECTED" in t),
            Case("environ_of_outside_process",
                 f"tr '\\0' '\\n' < /proc/{self.environ_target.pid}/environ",
                 lambda t: self.secret in t),
            Case("signal_outside_process",
                 f"kill -TERM {self.signal_target.pid} && echo SIGNALLED",
                 lambda t: "SIGNALLED" in t),
            Case("capabilities", caps_script, caps_held),
            # The ones Landlock cannot stop (LANDLOCK_GAPS); bwrap must stop them too.
            Case("read_hidden_state",
                 f'umount -l "{st}" 2>/dev/null; ls -A "{st}" | sed s/^/LS:/; '
                 f'cat "{self.other_log}"',
                 lambda t: self.secret in t or "LS:" in t),
            Case("hidden_unix_socket", f"{py} -c \"{connect_py}\" \"{self.unix_path}\"",
                 lambda t: self._accepted(self.unix) or "CONNECTED" in t),
            Case("host_run_socket", f"{py} -c \"{connect_py}\" \"{self.run_path}\"",
                 lambda t: self._accepted(self.run_sock) or "CONNECTED" in t),
            Case("udp_datagram", f"echo x > /dev/udp/127.0.0.1/{self.udp.getsockname()[1]}",
                 lambda t: self._received()),
            Case("chmod_outside", f'chmod 0777 "{self.victim}"',
                 lambda t: stat.S_IMODE(self.victim.stat().st_mode) != self.victim_mode),
            Case("utime_outside", f'touch -d "2001-01-01 00:00:00" "{self.victim}"',
                 lambda t: self.victim.stat().st_mtime_ns != self.victim_mtime),
            # Issue 10 item 3: move a mask's parent away, then read and write beneath it.
            Case("rename_mask_parent",
                 "mv .local/state .local/state.x || mv .local .local.x; "
                 "cat .local/state.x/dsh/log .local.x/state/dsh/log 2>/dev/null; "
                 "echo pwn > .local/state.x/dsh/planted",
                 lambda t: not (self.inner_state / "log").is_file() or self.secret in t,
                 inner=True),
            Case("rename_socket_dir",
                 "mv .local/run .local/run.x || mv .local .local.x; "
                 f"for p in .local/run.x/dshd.sock .local.x/run/dshd.sock; do "
                 f'{py} -c "{connect_py}" "$p" 2>/dev/null; done',
                 lambda t: not self.inner_sock_path.exists() or self._accepted(self.inner_sock)
                 or "CONNECTED" in t,
                 inner=True),
            Case("inner_unix_socket", f'{py} -c "{connect_py}" .local/run/dshd.sock',
                 lambda t: self._accepted(self.inner_sock) or "CONNECTED" in t, inner=True),
            # Issue 10 item 4: the host's sysctls (the same value is written back).
            Case("proc_sys_write",
                 f"echo {self.printk_value} > /proc/sys/kernel/printk_ratelimit && echo WROTE",
                 lambda t: "WROTE" in t),
            # Issue 10 item 5: a datagram through a Python socket, not bash's /dev/udp.
            Case("udp_sendto",
                 f"{py} -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                 f".sendto(b'x', ('127.0.0.1', {self.udp.getsockname()[1]}))\"",
                 lambda t: self._received()),
        ]


@pytest.fixture
def arena(scratch_root: Path):
    root = scratch_root / f"arena-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    a = Arena(root)
    try:
        yield a
    finally:
        a.close()


async def run_cases(provider, mode: str, arena: Arena) -> tuple[list[str], list[str], dict]:
    """Run every case; ``(names, escaped names, outputs)``."""
    names, escaped, outputs = [], [], {}
    for case in arena.cases():
        hide = arena.inner_hide if case.inner else arena.hide
        try:
            outcome, text, _ = await run_confined(provider, case.script, mode, str(arena.ws),
                                                  hide=hide)
        except SandboxUnavailable as exc:  # refused to run at all: nothing got out
            names.append(case.name)
            outputs[case.name] = ("refused", str(exc))
            continue
        names.append(case.name)
        outputs[case.name] = (outcome.exit_code, text)
        if case.escaped(text):
            escaped.append(case.name)
    return names, escaped, outputs


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
@pytest.mark.parametrize("name", ["bwrap", "landlock"])
async def test_escape_suite(provider_of, arena: Arena, name: str, mode: str) -> None:
    provider = provider_of(name)
    names, escaped, outputs = await run_cases(provider, mode, arena)
    gaps = LANDLOCK_GAPS if name == "landlock" else {}
    contract = [n for n in names if n not in gaps]
    contract_escapes = [n for n in escaped if n not in gaps]
    gap_escapes = [n for n in escaped if n in gaps]
    line = f"{name}/{mode}: {len(contract)} cases, {len(contract_escapes)} escaped"
    if gaps:
        got_out = ", ".join(gap_escapes) or "-"
        line += f"; documented Landlock gaps {len(gap_escapes)}/{len(gaps)} got out ({got_out})"
    ESCAPE_REPORT.append(line)
    print(line)
    assert contract_escapes == [], {n: outputs[n] for n in contract_escapes}
    for gap in gap_escapes:
        assert LANDLOCK_GAPS[gap] in provider.reason, (gap, provider.reason)
    assert len(names) == len(set(names)) >= 32


async def test_danger_full_access_escapes(provider_of, arena: Arena) -> None:
    """The control: unconfined, the checks see every case get out (so they can see one)."""
    provider = provider_of("bwrap")
    names, escaped, outputs = await run_cases(provider, "danger-full-access", arena)
    expected = set(names)
    if os.geteuid() != 0:
        expected.discard("capabilities")  # an unprivileged test run holds none to begin with
        expected.discard("proc_sys_write")  # nor may it write a sysctl
    missing = sorted(expected - set(escaped))
    ESCAPE_REPORT.append(
        f"control danger-full-access: {len(escaped)}/{len(names)} cases got out (expected all)"
    )
    assert missing == [], {n: outputs[n] for n in missing}


@pytest.mark.parametrize("name", ["bwrap", "landlock", "none"])
async def test_danger_full_access_is_unconfined(provider_of, providers, arena, name) -> None:
    provider = NoSandbox() if name == "none" else provider_of(name)
    argv, completeness = provider.confine(["true"], "danger-full-access", str(arena.ws))
    assert (argv, completeness) == (["true"], "none")
    target = arena.outside / "danger"
    outcome, _, _ = await run_confined(
        provider, f'echo x > "{target}"', "danger-full-access", str(arena.ws)
    )
    assert outcome.exit_code == 0 and target.exists()


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
@pytest.mark.parametrize("name", ["bwrap", "landlock"])
async def test_workspace_and_private_tmp(provider_of, arena: Arena, name: str, mode: str) -> None:
    """The workspace is writable only in workspace-write; the private tmp is writable in both."""
    provider = provider_of(name)
    m = arena.marker
    script = (
        f'echo w > cwd-{m} && echo CWD-OK; '
        f't="${{TMPDIR:-/tmp}}/t-{m}"; echo t > "$t" && cat "$t" && echo TMP-OK; '
        f"cat cwd-{m} 2>/dev/null; ls movable"
    )
    outcome, text, completeness = await run_confined(provider, script, mode, str(arena.ws))
    assert completeness == provider.completeness
    assert "TMP-OK" in text
    assert "movable" in text  # the workspace is readable in both modes
    assert ("CWD-OK" in text) == (mode == "workspace-write"), text
    assert (arena.ws / f"cwd-{m}").exists() == (mode == "workspace-write")
    assert not (Path("/tmp") / f"t-{m}").exists()
