"""The probe: real confined ``true`` and a real write that must fail, per provider (EXEC.md §3).

Broken providers are made with injected binaries (a missing path, a fake bwrap that fails like
an unprivileged container, a fake bwrap that does not confine at all) — the probe must skip each
with a reason, never pick it.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from dshd.execution import landlock_exec
from dshd.execution.sandbox import NoSandbox, Provider, SandboxUnavailable, probe

DESCRIBE_KEYS = {"provider", "completeness", "reason", "skipped"}


def fake_bwrap(directory: Path, body: str) -> str:
    """An executable shell script standing in for bwrap; ``--version``/``--help`` answer."""
    path = directory / "bwrap"
    path.write_text(
        "#!/bin/sh\n"
        'case "$1" in --version) echo "bubblewrap 9.9-fake"; exit 0;; '
        '--help) echo "usage: bwrap"; exit 0;; esac\n' + body
    )
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    return tmp_path / "scratch"


async def test_none_gives_nosandbox(scratch) -> None:
    provider = await probe("none", scratch_dir=scratch)
    assert isinstance(provider, NoSandbox) and isinstance(provider, Provider)
    assert set(provider.describe()) == DESCRIBE_KEYS
    assert provider.describe()["provider"] == "none"
    assert provider.completeness == "none"


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_nosandbox_refuses_confining_modes(mode) -> None:
    with pytest.raises(SandboxUnavailable) as info:
        NoSandbox().confine(["true"], mode, "/tmp")
    message = str(info.value)
    assert mode in message and "bubblewrap" in message and "danger-full-access" in message


def test_nosandbox_runs_danger_full_access_unchanged() -> None:
    assert NoSandbox().confine(["a", "b"], "danger-full-access", "/tmp") == (["a", "b"], "none")
    with pytest.raises(ValueError):
        NoSandbox().confine(["a"], "sideways", "/tmp")


async def test_auto_picks_bwrap_here(scratch) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed on this machine")
    provider = await probe("auto", scratch_dir=scratch)
    assert provider.name == "bwrap", provider.describe()
    described = provider.describe()
    assert set(described) == DESCRIBE_KEYS
    assert described["completeness"] == "full" and described["skipped"] == []
    assert "write outside the workspace was refused" in described["reason"]


async def test_forced_landlock(scratch) -> None:
    abi, err = landlock_exec.landlock_abi()
    if abi < 1:
        pytest.skip(f"Landlock is unavailable here ({os.strerror(err)})")
    provider = await probe("landlock", scratch_dir=scratch)
    assert provider.name == "landlock", provider.describe()
    assert provider.completeness == "partial"
    assert f"Landlock ABI {abi}" in provider.reason
    assert provider.abi == abi
    if abi < 4:
        assert "no TCP rules" in provider.reason
    assert "Unix sockets are refused outright by a seccomp filter" in provider.reason


async def test_missing_bwrap_binary_is_skipped(scratch) -> None:
    provider = await probe("auto", scratch_dir=scratch, bwrap_path="/nonexistent/bwrap")
    assert provider.name in ("landlock", "none")
    skipped = provider.describe()["skipped"]
    assert skipped[0]["provider"] == "bwrap"
    assert "/nonexistent/bwrap does not exist" in skipped[0]["reason"]
    assert "skipped bwrap" in provider.reason or provider.name == "none"


async def test_bwrap_not_on_path_is_skipped(scratch, tmp_path, monkeypatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    provider = await probe("auto", scratch_dir=scratch)
    skipped = provider.describe()["skipped"]
    assert skipped[0] == {
        "provider": "bwrap",
        "reason": "bwrap was not found on PATH; install bubblewrap for the full sandbox",
    }


async def test_bwrap_without_namespaces_is_skipped_with_a_hint(scratch, tmp_path) -> None:
    path = fake_bwrap(
        tmp_path,
        'echo "bwrap: setting up uid map: Permission denied" >&2\nexit 1\n',
    )
    provider = await probe("auto", scratch_dir=scratch, bwrap_path=path)
    assert provider.name != "bwrap"
    reason = provider.describe()["skipped"][0]["reason"]
    assert "setting up uid map: Permission denied" in reason
    assert "user namespaces look unavailable" in reason


async def test_bwrap_that_does_not_confine_is_caught(scratch, tmp_path) -> None:
    """A 'bwrap' that runs the command unconfined passes `true` but fails the write test."""
    path = fake_bwrap(
        tmp_path,
        'while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n',
    )
    provider = await probe("bwrap", scratch_dir=scratch, bwrap_path=path)
    assert isinstance(provider, NoSandbox)
    assert "escaped" in provider.reason and "bwrap" in provider.reason
    with pytest.raises(SandboxUnavailable) as info:
        provider.confine(["true"], "workspace-write", "/tmp")
    assert "escaped" in str(info.value)
    assert not any(p.name.startswith("probe-outside") for p in scratch.iterdir())


async def test_forced_provider_that_fails_gives_nosandbox(scratch) -> None:
    provider = await probe("bwrap", scratch_dir=scratch, bwrap_path="/nonexistent/bwrap")
    assert isinstance(provider, NoSandbox)
    assert provider.reason.startswith("the configured sandbox provider bwrap does not work here")
    assert provider.describe()["skipped"][0]["provider"] == "bwrap"


async def test_landlock_missing_from_kernel_is_skipped(scratch, monkeypatch) -> None:
    monkeypatch.setattr(landlock_exec, "landlock_abi", lambda: (0, errno.EOPNOTSUPP))
    provider = await probe("landlock", scratch_dir=scratch)
    assert isinstance(provider, NoSandbox)
    assert "lsm=" in provider.reason


async def test_auto_with_nothing_working_explains_itself(scratch, monkeypatch) -> None:
    monkeypatch.setattr(landlock_exec, "landlock_abi", lambda: (0, errno.ENOSYS))
    provider = await probe("auto", scratch_dir=scratch, bwrap_path="/nonexistent/bwrap")
    assert isinstance(provider, NoSandbox)
    assert provider.reason.startswith("no sandbox provider works here")
    assert [s["provider"] for s in provider.describe()["skipped"]] == ["bwrap", "landlock"]


async def test_probe_leaves_no_scratch_files(scratch) -> None:
    await probe("auto", scratch_dir=scratch)
    await probe("landlock", scratch_dir=scratch)
    leftovers = [p.name for p in scratch.iterdir() if p.name != "landlock-tmp"]
    assert leftovers == []
    assert list((scratch / "landlock-tmp").iterdir()) == []


async def test_unknown_preference_is_an_error(scratch) -> None:
    with pytest.raises(ValueError):
        await probe("firejail", scratch_dir=scratch)
