"""The service install (issue 9 item 2): `make install-system` / `make install-user` and their
uninstalls, for real, into locations a test may own.

Why PREFIX/UNITDIR/DOCDIR (and HOME) point into a temporary directory rather than /opt/dsh and
/etc/systemd/system: the recipe is the same one (systemd/install.sh), the venv is built at its
final place (a venv is not relocatable, so a DESTDIR staging would not be honest, and this is
not one), the units are generated from the same templates with those paths filled in, and the
generated ExecStart is then run verbatim. What differs from a default install is only where the
files land, and the test cannot break (or be broken by) a real install on the machine. The one
machine-wide effect is the group `dsh`: created if missing and, being recorded in the
manifest, removed again by uninstall. systemd is not PID 1 here, so the units are checked with
`systemd-analyze verify` and the ExecStart line runs under `systemd-socket-activate` with a
real NOTIFY_SOCKET, which is what systemd would do with dshd.socket + dshd.service.
"""

from __future__ import annotations

import grp
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from .notify import NotifyListener

REPO = Path(__file__).resolve().parents[2]
ANALYZE = shutil.which("systemd-analyze")
ACTIVATE = shutil.which("systemd-socket-activate")


def _make(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(REPO), "--no-print-directory", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=env or dict(os.environ), stdin=subprocess.DEVNULL)


def _unit_value(unit: Path, key: str) -> str:
    (line,) = [ln for ln in unit.read_text().splitlines() if ln.startswith(f"{key}=")]
    return line.split("=", 1)[1]


def verify_units(*units: Path, user: bool = False) -> None:
    """`systemd-analyze verify` must be clean: exit 0 and nothing on stderr (an unknown key is
    only a warning there)."""
    if ANALYZE is None:
        pytest.skip("systemd-analyze is not installed")
    env = dict(os.environ)
    args = [ANALYZE, "verify", "--man=no", *map(str, units)]
    if user:
        runtime = Path(tempfile.mkdtemp(prefix="dsh-rt-"))
        env["XDG_RUNTIME_DIR"] = str(runtime)
        args.insert(1, "--user")
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.fixture
def short_dir():
    d = Path(tempfile.mkdtemp(prefix="dsh-inst-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


@pytest.mark.skipif(os.getuid() != 0, reason="install-system needs root")
def test_install_system_serves_under_socket_activation_and_uninstalls(short_dir):
    locs = [f"PREFIX={short_dir}/opt/dsh", f"UNITDIR={short_dir}/etc/systemd/system",
            f"DOCDIR={short_dir}/usr/share/doc/dsh"]
    group_before = _group_exists("dsh")
    try:
        _install_system_and_serve(short_dir, locs)
    finally:  # never leave the group (or anything else) behind, even when an assert failed
        if (short_dir / "opt/dsh/install-manifest").exists():
            _make("uninstall-system", *locs)
    r = _make("uninstall-system", *locs)
    assert r.returncode != 0 and "nothing to uninstall" in r.stderr
    assert not (short_dir / "opt").exists()
    assert not (short_dir / "usr").exists()
    assert not (short_dir / "etc").exists()
    assert _group_exists("dsh") == group_before
    assert (short_dir / "state").is_dir()  # session state is never removed


def _install_system_and_serve(short_dir: Path, locs: list[str]) -> None:
    r = _make("install-system", *locs)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no daemon-reload was run" in r.stdout  # these units are not where systemd looks
    units = short_dir / "etc/systemd/system"
    service, socket_unit = units / "dshd.service", units / "dshd.socket"
    verify_units(service, socket_unit)
    assert _group_exists("dsh")
    # Documentation= names a file that exists; ExecStart points into the venv.
    doc = _unit_value(service, "Documentation")
    assert doc.startswith("file://") and Path(doc[len("file://"):]).is_file()
    assert (short_dir / "usr/share/doc/dsh/docs/PROTOCOL.md").is_file()
    argv = shlex.split(_unit_value(service, "ExecStart"))
    assert argv[0] == f"{short_dir}/opt/dsh/venv/bin/dshd" and "--system" in argv
    assert _unit_value(service, "Wants") == "dshd.socket"
    assert not [ln for ln in service.read_text().splitlines() if ln.startswith("Requires=")]
    # The one stop budget: stop_timeout_seconds' default (10 s) plus dshd's 5 s margin.
    assert _unit_value(service, "TimeoutStopSec") == "15"
    # Not editable: the venv holds its own copy of the code.
    py = f"{short_dir}/opt/dsh/venv/bin/python"
    where = subprocess.run([py, "-c", "import dshd; print(dshd.__file__)"], cwd="/",
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(f"{short_dir}/opt/dsh/venv/"), where

    if ACTIVATE is None:
        pytest.skip("systemd-socket-activate is not installed")
    # ExecStart verbatim under socket activation (the socket unit's part), a real NOTIFY_SOCKET
    # and a watchdog (the service unit's part); state in the test's directory instead of
    # StateDirectory=dsh (/var/lib/dsh).
    notify = NotifyListener(short_dir / "notify")
    sock = short_dir / "run" / "dshd.sock"
    sock.parent.mkdir()
    proc = subprocess.Popen(
        [ACTIVATE, "-l", str(sock), "-E", f"NOTIFY_SOCKET={notify.path}",
         "-E", "WATCHDOG_USEC=4000000", "-E", f"DSH_STATE_DIR={short_dir}/state", *argv],
        cwd="/", stdout=subprocess.DEVNULL, stderr=open(short_dir / "dshd.log", "wb"))
    try:
        deadline_wait = 60
        for _ in range(200):
            if sock.exists():
                break
            proc.poll()
            assert proc.returncode is None, (short_dir / "dshd.log").read_text()
            subprocess.run(["sleep", "0.05"])
        env = dict(os.environ, DSH_SOCKET=str(sock))
        st = subprocess.run([f"{short_dir}/opt/dsh/venv/bin/dsh", "status", "--json"], env=env,
                            capture_output=True, text=True, timeout=deadline_wait)
        assert st.returncode == 0, st.stderr + (short_dir / "dshd.log").read_text()
        assert json.loads(st.stdout)["pid"] == proc.pid  # activation exec'd dshd itself
        notify.wait_for(lambda m: m.get("READY") == "1", 30, since=0)
        notify.wait_for(lambda m: m.get("WATCHDOG") == "1", 30)
        # The passed socket, not /run/dsh/dshd.sock: read from dshd's JSON ready line (the
        # lines are JSON values, not a byte layout; systemd-socket-activate's own lines are not
        # JSON).
        ready = [line for line in _json_lines(short_dir / "dshd.log")
                 if line.get("event") == "dshd.ready"]
        assert [line.get("socket") for line in ready] == [str(sock)], ready
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        stopping = notify.wait_for(lambda m: m.get("STOPPING") == "1", 30, since=0)
        # ... and tells systemd the same budget (a raised key needs no edit of the unit).
        assert stopping.get("EXTEND_TIMEOUT_USEC") == "15000000", stopping
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        notify.close()

    r = _make("uninstall-system", *locs)
    assert r.returncode == 0, r.stdout + r.stderr


def _json_lines(path: Path) -> list[dict]:
    """The lines of ``path`` that are JSON objects (dshd's log with ``--log-format json``)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _user_env(home: Path) -> dict[str, str]:
    """HOME moved to ``home``; the XDG overrides dropped; PATH without per-user tool proxies
    (rustup's write their settings into whatever HOME is)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if "/.cargo/" not in p + "/")
    return env


def test_install_user_then_uninstall_leaves_home_as_it_was(short_dir):
    home = short_dir / "home"
    (home / ".config").mkdir(parents=True)
    (home / ".config" / "keep.txt").write_text("mine\n")
    before = _tree(home)
    env = _user_env(home)
    r = _make("install-user", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    units = home / ".config/systemd/user"
    verify_units(units / "dshd.service", units / "dshd.socket", user=True)
    assert _unit_value(units / "dshd.service", "TimeoutStopSec") == "15"
    argv = shlex.split(_unit_value(units / "dshd.service", "ExecStart"))
    venv_bin = home / ".local/share/dsh/venv/bin"
    assert argv[0] == str(venv_bin / "dshd")
    doc = _unit_value(units / "dshd.service", "Documentation")
    assert Path(doc[len("file://"):]).is_file()
    for exe in ("dsh", "dshd"):
        link = home / ".local/bin" / exe
        assert link.is_symlink() and Path(os.readlink(link)) == venv_bin / exe
    v = subprocess.run([str(home / ".local/bin/dsh"), "--version"], capture_output=True,
                       text=True, env=env)
    assert v.returncode == 0 and "0." in v.stdout, v.stderr
    # A second install upgrades in place; someone else's file is never overwritten.
    r = _make("install-user", env=env)
    assert r.returncode == 0, r.stdout + r.stderr

    r = _make("uninstall-user", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _tree(home) == before


def test_install_refuses_a_unit_it_did_not_install(short_dir):
    home = short_dir / "home"
    units = home / ".config/systemd/user"
    units.mkdir(parents=True)
    (units / "dshd.service").write_text("# hand-made\n")
    env = _user_env(home)
    before = _tree(short_dir)
    r = _make("install-user", env=env)
    assert r.returncode != 0
    assert "dshd.service exists and was not installed" in r.stderr
    assert (units / "dshd.service").read_text() == "# hand-made\n"
    assert _tree(short_dir) == before  # refused before it touched anything
    r = _make("uninstall-user", env=env)
    assert r.returncode != 0 and "nothing to uninstall" in r.stderr
    assert _tree(short_dir) == before
