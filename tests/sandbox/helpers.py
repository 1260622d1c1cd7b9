"""Run a shell script through a provider with the real runner (a call host per run)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import trio

from dshd.execution.capture import OutputCapture, ShellOutputLimits
from dshd.execution.hosted import ExecOutcome, run_hosted
from dshd.execution.spawn import bash_argv
from dshd.execution.sandbox import Provider


def call_env(call_id: str = "call-test", session_id: str = "session-test") -> dict[str, str]:
    env = dict(os.environ)
    env["DSH_CALL_ID"] = call_id
    env["DSH_SESSION_ID"] = session_id
    return env


async def run_confined(
    provider: Provider,
    script: str,
    mode: str,
    workspace: str,
    *,
    hide: list[str] = (),
    network: bool = False,
    env: dict[str, str] | None = None,
    cancel: trio.Event | None = None,
    timeout: float | None = 60.0,
) -> tuple[ExecOutcome, str, str]:
    """``(outcome, output text, completeness)`` of ``bash -c script`` confined by ``provider``."""
    fds: list[int] = []
    argv, completeness = provider.confine(
        bash_argv(script), mode, workspace, hide=list(hide), network=network, fds=fds
    )
    capture = OutputCapture(ShellOutputLimits(), None)
    outcome = await run_hosted(
        argv,
        call_dir=Path(tempfile.mkdtemp(prefix="dsh-call-")),
        cwd=workspace,
        env=env if env is not None else call_env(),
        capture=capture,
        on_output=lambda: None,
        timeout=timeout,
        cancel=cancel if cancel is not None else trio.Event(),
        kill_grace=2.0,
        eof_grace=2.0,
        pass_fds=fds,
    )
    return outcome, capture.text, completeness
