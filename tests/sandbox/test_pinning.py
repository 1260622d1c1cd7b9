"""Issue 11 items 1 and 2 without a daemon, deterministically (real bwrap, real Landlock).

The workspace is pinned by fd when confined; these tests swap its path for a symlink to a
writable directory outside at the two points a race would hit — between ``confine`` and the
spawn, and inside :func:`pin_workspace` between its open and its check — so nothing depends on
luck. And :func:`landlock_exec.collect_garbage` meets names it did not make.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from dshd.execution import landlock_exec
from dshd.execution.sandbox import SandboxUnavailable, close_fds, pin_workspace

from .helpers import call_env

PROVIDERS = ["bwrap", "landlock"]


@pytest.fixture
def area(scratch_root):
    root = scratch_root / f"pin-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def swap_area(area):
    """``(ws, outside)``: a workspace and a writable directory outside it."""
    ws = area / "wsD" / "sub2"
    ws.mkdir(parents=True)
    outside = area / "outside"
    outside.mkdir()
    return ws, outside


def _swap(ws, outside) -> None:
    """What the attacker does: rename the workspace away, a symlink to ``outside`` in its place."""
    os.rename(ws, ws.parent / "real")
    os.symlink(outside, ws)


def _spawn(argv: list[str], cwd, fds: list[int]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, cwd=cwd, env=call_env(), capture_output=True, text=True,
                              timeout=60, pass_fds=tuple(fds), stdin=subprocess.DEVNULL)
    finally:
        close_fds(fds)


@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
@pytest.mark.parametrize("name", PROVIDERS)
def test_a_path_swapped_between_confine_and_spawn_binds_the_pinned_directory(
        provider_of, swap_area, name, mode) -> None:
    """Before: bwrap bound, and the launcher ruled, whatever the path named at spawn time — the
    outside directory, writable. Now the pinned directory is what the sandbox gets (or bwrap
    refuses to mount at a path that is a symlink); never the outside."""
    ws, outside = swap_area
    fds: list[int] = []
    argv, _ = provider_of(name).confine(
        ["/bin/sh", "-c", 'echo x > ./WIN && echo WROTE; echo x > "$1/WIN2"; pwd',
         "sh", str(ws)], mode, str(ws), fds=fds)
    _swap(ws, outside)
    result = _spawn(argv, ws.parent, fds)
    assert list(outside.iterdir()) == [], (result.stdout, result.stderr)
    real = ws.parent / "real"
    if mode == "workspace-write" and "WROTE" in result.stdout:
        assert (real / "WIN").is_file()
    if name == "landlock":  # the inherited fd: the rule and the cwd are the pinned directory
        assert result.returncode == 0, result.stderr
        assert ("WROTE" in result.stdout) == (mode == "workspace-write"), result.stdout
    else:  # bwrap: its own fstat/stat comparison or the symlinked mount point stops it
        assert result.returncode != 0 or "WROTE" not in result.stdout, result


def test_the_landlock_launcher_without_the_fd_checks_its_own_open(provider_of, swap_area):
    """Without ``fds`` the launcher gets the path and the identity, and refuses (exit 126, a
    sentence naming the path) when its own open finds another directory there."""
    ws, outside = swap_area
    argv, _ = provider_of("landlock").confine(["/bin/sh", "-c", "echo x > WIN"],
                                              "workspace-write", str(ws))
    rules = json.loads(argv[argv.index("--rules-json") + 1])
    assert "fd" not in rules["workspace"]
    _swap(ws, outside)
    result = _spawn(argv, ws.parent, [])
    assert result.returncode == landlock_exec.EXIT_SETUP_FAILED, result
    assert str(ws) in result.stderr and "no longer the directory" in result.stderr
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("name", PROVIDERS)
def test_a_swap_during_the_pin_fails_closed(provider_of, swap_area, monkeypatch, name):
    """A rename between ``pin_workspace``'s open and its check (the hook: the open itself
    triggers it) is caught — the fd's path is not the session directory — and the call is
    refused with SANDBOX_UNAVAILABLE's sentence naming the path; nothing stays open."""
    ws, outside = swap_area
    real_open = os.open

    def open_then_swap(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if str(path) == str(ws) and flags & os.O_PATH:
            _swap(ws, outside)
        return fd

    monkeypatch.setattr(os, "open", open_then_swap)
    fds: list[int] = []
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(SandboxUnavailable) as info:
        provider_of(name).confine(["true"], "workspace-write", str(ws), fds=fds)
    assert str(ws) in str(info.value) and "not where it was" in str(info.value)
    assert fds == [] and set(os.listdir("/proc/self/fd")) <= before | {str(max(map(int, before)) + 1)}


def test_a_path_that_leads_elsewhere_is_refused(swap_area) -> None:
    """Already swapped when pinned: the open lands on the outside directory, whose own path is
    not the session directory — refused, so the checks never judge the attacker's choice."""
    ws, outside = swap_area
    _swap(ws, outside)
    with pytest.raises(SandboxUnavailable, match="not where it was"):
        pin_workspace(str(ws))
    os.unlink(ws)
    os.rename(ws.parent / "real", ws)
    pinned = pin_workspace(str(ws))
    try:
        assert pinned.path == str(ws)
        assert (pinned.dev, pinned.ino) == (os.stat(ws).st_dev, os.stat(ws).st_ino)
    finally:
        os.close(pinned.fd)


# ------------------------------------------------------------------------------- item 2
STRAY = ["99999999999999999999-x", "4194304-aaaaaaaaaaaa", "\u00b2-aaaaaaaaaaaa", "12-x",
         "-12-aaaaaaaaaaaa", "0-aaaaaaaaaaaa", "plain", "012-aaaaaaaaaaaa"]


def test_collect_garbage_leaves_names_it_did_not_make(tmp_path) -> None:
    """Before: ``99999999999999999999-x`` raised OverflowError (killpg), ``²-x`` ValueError —
    every Landlock launch failed and the daemon's probe died. Now those are left alone, and a
    directory of a gone process group that the launcher made is still removed."""
    for name in STRAY:
        (tmp_path / name).mkdir()
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    ours = f"{gone.pid}-{'ab' * 6}"
    (tmp_path / ours).mkdir()
    assert landlock_exec.collect_garbage(str(tmp_path), 100) == 1
    assert sorted(os.listdir(tmp_path)) == sorted(STRAY)


def test_a_landlock_launch_survives_stray_names(provider_of, area) -> None:
    provider = provider_of("landlock")
    for name in STRAY:
        os.makedirs(os.path.join(provider.tmp_root, name), exist_ok=True)
    try:
        fds: list[int] = []
        argv, _ = provider.confine(["/bin/sh", "-c", "echo ran"], "workspace-write", str(area),
                                   fds=fds)
        result = _spawn(argv, area, fds)
        assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
    finally:
        for name in STRAY:
            shutil.rmtree(os.path.join(provider.tmp_root, name), ignore_errors=True)
