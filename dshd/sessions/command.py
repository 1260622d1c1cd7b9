"""A call's command and its owner: confine it, start it, watch it, get its outcome.

Theory of operation (EXEC.md §1, §3; HOST.md §2): once a call has passed its gate and its
barrier, :func:`run` hands its command to the command's *owner* and watches it until the owner
reports an outcome. Today the owner is ``dshd.execution.process.run_command``, in this process:
the tool's registry entry (``dshd.tools``) turns the call's arguments into a script,
the command line is confined by the session's sandbox (``confine``; the session env and the
call's ids are set inside the sandbox by ``env(1)``, so nothing in them reaches the wrapper),
runs as the session's owner with the documented minimal environment, and its output is captured
at the source into the call's ``OutputCapture`` while :func:`output.checkpoint_output` keeps
its pending-output sidecar. The call asks the owner to end the command by setting
``terminate`` (TERM, ``kill_grace``, KILL; the outcome says ``cancelled``). The call-host issue
replaces this owner by a host process that outlives the daemon; the interface stays: a spec in,
an outcome out, a terminate request in between.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Protocol

import trio

from .. import identity, tools
from ..config import Config
from ..execution.capture import OutputCapture
from ..execution.env import tool_env
from ..execution.process import ExecOutcome, run_command
from ..execution.sandbox import SandboxUnavailable
from ..paths import is_within
from ..results import CallFailed, sentence
from ..storage.sidecar import PendingOutput
from . import barrier
from .output import checkpoint_output


def tool_base_env(config: Config, owner: int | None) -> dict[str, str]:
    """The documented minimal environment of a tool (EXEC.md §1; ``dshd.execution.env``)."""
    ident = identity.run_as_for(owner)
    uid = ident.uid if ident is not None else os.geteuid()
    return tool_env(uid, pass_env=config.pass_env, secret=(config.model.api_key_env,))


@dataclass
class CommandSpec:
    """What the owner needs of a call: its id, its tool and arguments, where its output goes,
    and the terminate request it watches."""

    call_id: str
    name: str
    arguments: dict
    capture: OutputCapture
    pending: PendingOutput
    terminate: trio.Event


class SessionSettings(Protocol):
    """The session settings a command runs under."""

    id: str
    env: dict[str, str]
    mode: str
    owner: int | None


async def run(spec: CommandSpec, session: SessionSettings, cwd: str, config: Config, sandbox, *,
              on_start: Callable[[], None], on_output: Callable[[], None],
              ) -> tuple[ExecOutcome, str]:
    """Confine and run the command; ``(outcome, completeness)``. Raises CallFailed
    (``SANDBOX_UNAVAILABLE``) before anything started. ``on_start`` is called right before the
    command is handed to its owner, ``on_output`` whenever its capture changed."""
    if is_within(cwd, config.state_path()):
        raise CallFailed("SANDBOX_UNAVAILABLE", sentence("SANDBOX_UNAVAILABLE", "state-dir", cwd=cwd))
    inner_env = dict(session.env)
    inner_env["DSH_CALL_ID"] = spec.call_id
    inner_env["DSH_SESSION_ID"] = session.id
    inner = ["env", "--", *(f"{k}={v}" for k, v in inner_env.items())]
    invocation = tools.TOOLS[spec.name].invoke(spec.arguments)
    script = invocation.script  # run_command closes it
    fds: list[int] = []  # the sandbox's pinned workspace and lease; run_command closes them
    try:
        argv, completeness = sandbox.confine(
            inner + script.argv, session.mode, cwd,
            hide=[str(config.state_path()), str(config.socket_path())],
            network=config.network, fds=fds,
        )
    except SandboxUnavailable as exc:
        script.close()
        raise CallFailed("SANDBOX_UNAVAILABLE", sentence("SANDBOX_UNAVAILABLE", reason=exc)) from None
    env = tool_base_env(config, session.owner)
    on_start()
    with barrier.passed("tool/dispatch"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(checkpoint_output, spec, session.id)
            outcome = await run_command(
                argv, cwd=cwd, env=env, capture=spec.capture, on_output=on_output,
                timeout=invocation.timeout,
                cancel=spec.terminate,
                kill_grace=config.kill_grace_seconds, eof_grace=config.eof_grace_seconds,
                as_user=identity.run_as_for(session.owner), script=script, pass_fds=fds,
                spare_wrapper=(getattr(sandbox, "wrapper_comm", None)
                               if completeness != "none" else None),
            )
            nursery.cancel_scope.cancel()
    return outcome, completeness
