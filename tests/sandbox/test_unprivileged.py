"""The providers as an unprivileged daemon would use them (CI runs as root, dshd usually not).

A throw-away system user is created with ``useradd`` for the session and removed afterwards.
The wrapped argv is built here (confining is pure argv rewriting) and run as that user with
``setpriv --reuid --regid --clear-groups``: bwrap must then create its namespaces through an
unprivileged user namespace, and the Landlock launcher runs without any capability.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from dshd.execution import landlock_exec
from dshd.execution.sandbox_bwrap import BwrapProvider
from dshd.execution.sandbox_landlock import LandlockProvider

USER = "dshsbxtest"


@pytest.fixture(scope="session")
def unprivileged_user():
    if os.geteuid() != 0:
        pytest.skip("creating a test user needs root (this run is already unprivileged)")
    for tool in ("useradd", "userdel", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not available, so no unprivileged user can be made")
    created = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            check=True, capture_output=True,
        )
        created = True
    entry = pwd.getpwnam(USER)
    yield entry.pw_uid, entry.pw_gid
    if created:
        subprocess.run(["userdel", USER], check=False, capture_output=True)


@pytest.fixture
def user_area(unprivileged_user):
    uid, gid = unprivileged_user
    root = Path(tempfile.mkdtemp(prefix="dsh-unpriv-", dir="/var/tmp"))
    root.chmod(0o755)
    for sub in ("ws", "outside", "scratch"):
        (root / sub).mkdir()
    for path in [root, *root.iterdir()]:
        os.chown(path, uid, gid)
    yield root, uid, gid
    shutil.rmtree(root, ignore_errors=True)


def run_as(uid: int, gid: int, argv: list[str], cwd: Path,
           fds: list[int] = ()) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/", "DSH_CALL_ID": "unpriv-call"}
    try:
        return subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=60, pass_fds=tuple(fds),
        )
    finally:
        for fd in fds:
            os.close(fd)


SCRIPT = (
    'id -u; echo in > inside && echo INSIDE-OK; echo out > "$1/escaped"; '
    'grep CapEff /proc/self/status; echo "call=$DSH_CALL_ID"'
)


def check(result: subprocess.CompletedProcess, root: Path, uid: int) -> None:
    out = result.stdout
    assert out.splitlines()[0] == str(uid), (out, result.stderr)
    assert "INSIDE-OK" in out and (root / "ws" / "inside").exists()
    assert not (root / "outside" / "escaped").exists(), result.stderr
    assert "CapEff:\t0000000000000000" in out
    assert "call=unpriv-call" in out


def test_bwrap_unprivileged(user_area) -> None:
    root, uid, gid = user_area
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bwrap is not installed")
    provider = BwrapProvider(bwrap, disable_userns=True)
    fds: list[int] = []
    argv, _ = provider.confine(
        ["/bin/sh", "-c", SCRIPT, "sh", str(root / "outside")], "workspace-write", str(root / "ws"),
        fds=fds,
    )
    result = run_as(uid, gid, argv, root / "ws", fds)
    if "uid map" in result.stderr or "namespace" in result.stderr:
        pytest.skip(f"unprivileged user namespaces are refused here: {result.stderr.strip()}")
    check(result, root, uid)


def test_landlock_unprivileged(user_area) -> None:
    root, uid, gid = user_area
    abi, _ = landlock_exec.landlock_abi()
    if abi < 1:
        pytest.skip("Landlock is unavailable here")
    python = "/usr/bin/python3"
    if not os.path.exists(python):
        pytest.skip("no system python3 the test user can run (the venv's may live under /root)")
    launcher = os.path.realpath(landlock_exec.__file__)
    provider = LandlockProvider(abi, python, launcher, str(root / "scratch" / "landlock-tmp"))
    argv, _ = provider.confine(
        ["/bin/sh", "-c", SCRIPT + '; echo t > "$TMPDIR/t" && echo TMP-OK', "sh",
         str(root / "outside")],
        "workspace-write",
        str(root / "ws"),
    )
    result = run_as(uid, gid, argv, root / "ws")
    if "Permission denied" in result.stderr and "landlock_exec" in result.stderr:
        pytest.skip(f"the test user cannot read the launcher: {result.stderr.strip()}")
    check(result, root, uid)
    assert "TMP-OK" in result.stdout
