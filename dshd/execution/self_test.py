"""The probe's real test of a provider: a confined ``true`` and a write that must not escape (EXEC.md §3).

Theory of operation: :func:`self_test` runs real commands under a provider -- ``true`` under
``workspace-write`` must exit 0; a write inside a scratch workspace must show up on the host
and a write next to it (outside) must not -- each bounded by :data:`PROBE_TIMEOUT`, and
returns None when the provider confines, else the sentence why not. Each provider's probe
(:func:`dshd.execution.sandbox_bwrap.probe_bwrap`,
:func:`dshd.execution.sandbox_landlock.probe_landlock`) calls it before it is chosen.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import trio

from dshd.execution.confine import Provider
from dshd.execution.workspace import close_fds

__all__ = ["PROBE_TIMEOUT", "self_test"]

#: Seconds one probe command may take before its provider counts as broken.
PROBE_TIMEOUT = 20.0


def _shell() -> str:
    return "/bin/sh" if os.path.exists("/bin/sh") else (shutil.which("sh") or "/bin/sh")


async def _run_probe_command(argv: list[str], cwd: Path,
                             fds: list[int]) -> subprocess.CompletedProcess:
    try:
        with trio.fail_after(PROBE_TIMEOUT):
            return await trio.run_process(
                argv,
                cwd=str(cwd),
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                start_new_session=True,
                pass_fds=tuple(fds),
            )
    finally:
        close_fds(fds)


def _stderr_tail(result: subprocess.CompletedProcess) -> str:
    text = (result.stderr or b"").decode("utf-8", "replace").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else f"exit status {result.returncode}, no message"


async def self_test(provider: Provider, scratch_dir: Path) -> str | None:
    """Run the real probe commands under ``provider``; None when it confines, else why not.

    1. ``true`` under ``workspace-write`` must exit 0;
    2. under ``workspace-write`` a write inside the workspace must show up on the host and a
       write to ``scratch_dir`` (outside it) must not.

    Each command is bounded by :data:`PROBE_TIMEOUT`. The scratch files are removed.
    """
    token = secrets.token_hex(6)
    workspace = scratch_dir / f"probe-workspace-{token}"
    outside = scratch_dir / f"probe-outside-{token}"
    inside = workspace / "inside"
    workspace.mkdir(parents=True)
    try:
        true = shutil.which("true") or "/bin/true"
        fds: list[int] = []
        argv, _ = provider.confine([true], "workspace-write", str(workspace), fds=fds)
        try:
            result = await _run_probe_command(argv, workspace, fds)
        except trio.TooSlowError:
            return f"a confined `true` did not finish within {PROBE_TIMEOUT:g} s"
        except OSError as exc:
            return f"a confined `true` could not start ({exc.strerror or exc})"
        if result.returncode != 0:
            return f"a confined `true` failed: {_stderr_tail(result)}"
        # Judged on the host only: under bwrap the outside write may "succeed" into the private
        # /tmp when the scratch directory lies under /tmp, which is no escape.
        script = 'echo ok > "$1" || exit 3; echo escaped > "$2"; exit 0'
        argv, _ = provider.confine(
            [_shell(), "-c", script, "sh", str(inside), str(outside)],
            "workspace-write",
            str(workspace),
            fds=fds,
        )
        try:
            result = await _run_probe_command(argv, workspace, fds)
        except trio.TooSlowError:
            return f"the confined write test did not finish within {PROBE_TIMEOUT:g} s"
        if outside.exists() or os.path.lexists(outside):
            return (
                f"the confined write test escaped: a write to {outside}, outside the "
                "workspace, succeeded"
            )
        if result.returncode != 0 or not inside.exists():
            return f"a write inside the workspace failed under confinement: {_stderr_tail(result)}"
        return None
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        try:
            os.unlink(outside)
        except OSError:
            pass
