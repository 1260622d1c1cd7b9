"""A call's command and its owner: confine it, start its call host, watch it, get its outcome.

Theory of operation (EXEC.md §1, §3; HOST.md §2): once a call has passed its gate and its
barrier, :func:`run` hands its command to the command's *owner*, a call host
(``dshd.execution.hosted``: one detached process per call that outlives the daemon's own
work), and watches it until the host reports an outcome. The tool's registry entry
(``dshd.tools``) turns the call's arguments into a script (and its terminal and stdin); the
command line is confined by the session's sandbox (``confine``; the session env and the call's
ids are set inside the sandbox by ``env(1)``, the call's own ``arguments.env`` over the session's, so nothing in them reaches the wrapper; the state
directory -- with the call's own directory -- and the socket are hidden), runs as the session's
owner with the documented minimal environment, and its output is read from the host's log into
the call's ``OutputCapture`` while :func:`output.checkpoint_output` keeps its pending-output
sidecar. The call dir ``<session dir>/calls/<callId>/`` (0700) holds the log, ``host.json``,
``exit.json`` and ``host.log``; it is made at the call's admission (:func:`make_call_dir`,
``dshd.sessions.calls``). The host is started with ``on_daemon_loss = "keep"`` when the daemon
detaches its calls on stop (``on_stop = "detach"``, HOST.md §7) and notes the sandbox's
completeness in ``host.json`` for a daemon that adopts it. The call asks the host to end the command by setting
``terminate`` (TERM, ``kill_grace``, KILL; the outcome says ``cancelled``); ``on_host`` hands
the call its :class:`~dshd.execution.hosted.HostHandle` (``Call.host``) once the host runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import trio

from .. import identity, tools
from ..config import Config
from ..execution.capture import OutputCapture
from ..execution.env import tool_env
from ..execution.hosted import ExecOutcome, HostHandle, run_hosted
from ..execution.sandbox import SandboxUnavailable
from ..paths import is_within
from ..results import CallFailed, sentence
from ..storage.sidecar import PendingOutput
from . import barrier
from .output import checkpoint_output


#: The keyboard's signals, ignored by a sandbox wrapper under a terminal (HOST.md §5).
TTY_SIGNALS = "INT,QUIT,TSTP"


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
    call_dir: Path
    #: Set at a daemon stop that detaches: the run lets go of the running command.
    detach: trio.Event | None = None
    #: The host keeps running when the daemon goes away (``on_stop = "detach"``).
    keep: bool = False


class SessionSettings(Protocol):
    """The session settings a command runs under."""

    id: str
    env: dict[str, str]
    mode: str
    owner: int | None


async def run(spec: CommandSpec, session: SessionSettings, cwd: str, config: Config, sandbox, *,
              on_start: Callable[[], None], on_output: Callable[[], None],
              on_host: Callable[[HostHandle], None] | None = None,
              ) -> tuple[ExecOutcome, str]:
    """Confine and run the command; ``(outcome, completeness)``. Raises CallFailed
    (``SANDBOX_UNAVAILABLE``) before anything started. ``on_start`` is called right before the
    command is handed to its host, ``on_output`` whenever its capture changed, ``on_host``
    with the host's handle once it runs."""
    if is_within(cwd, config.state_path()):
        raise CallFailed("SANDBOX_UNAVAILABLE", sentence("SANDBOX_UNAVAILABLE", "state-dir", cwd=cwd))
    # The call's own env (bash's arguments.env) over the session's.
    inner_env = {**session.env, **(spec.arguments.get("env") or {})}
    inner_env["DSH_CALL_ID"] = spec.call_id
    inner_env["DSH_SESSION_ID"] = session.id
    invocation = tools.TOOLS[spec.name].invoke(spec.arguments)
    # Under a terminal, the host starts the sandbox wrapper with the keyboard's signals
    # ignored (bwrap is in the terminal's foreground group: Ctrl-C would tear the sandbox
    # down before the command's trap ran); env gives the command their defaults back.
    restore = [f"--default-signal={TTY_SIGNALS}"] if invocation.tty is not None else []
    inner = ["env", *restore, "--", *(f"{k}={v}" for k, v in inner_env.items())]
    script = invocation.script  # run_hosted closes it
    fds: list[int] = []  # the sandbox's pinned workspace and lease; run_hosted closes them
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
    tty = None
    if invocation.tty is not None:
        tty = (invocation.tty.cols, invocation.tty.rows,
               inner_env.get("TERM") or "xterm-256color")
    on_start()
    with barrier.passed("tool/dispatch"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(checkpoint_output, spec, session.id)
            outcome = await run_hosted(
                argv, call_dir=spec.call_dir, cwd=cwd, env=env, capture=spec.capture,
                on_output=on_output, timeout=invocation.timeout, cancel=spec.terminate,
                kill_grace=config.kill_grace_seconds, eof_grace=config.eof_grace_seconds,
                as_user=identity.run_as_for(session.owner), script=script, pass_fds=fds,
                spare_wrapper=(getattr(sandbox, "wrapper_comm", None)
                               if completeness != "none" else None),
                tty=tty, stdin=invocation.stdin, spill_max_bytes=config.spill_max_bytes,
                linger=config.host_linger_seconds, on_host=on_host,
                on_daemon_loss="keep" if spec.keep else "terminate", detach=spec.detach,
                daemon_notes={"completeness": completeness, "sandbox": sandbox.name},
            )
            nursery.cancel_scope.cancel()
    return outcome, completeness


def make_call_dir(call_dir: Path) -> None:
    """Create the call's directory (and ``calls/``) with mode 0700, at the call's admission
    (the marker of an unsettled call, HOST.md §7). An existing one must be empty, or hold only
    the ``settled`` marker (left by an admission whose ``tool/call`` never became durable, and
    marked by the next open), and is made anew; one with other files (a call id reused) is
    refused: ``OSError``, since the host's log must be new."""
    calls = call_dir.parent
    try:
        os.mkdir(calls, 0o700)
    except FileExistsError:
        pass
    try:
        os.mkdir(call_dir, 0o700)
    except FileExistsError:
        if os.listdir(call_dir) == ["settled"]:  # resumed.SETTLED_MARKER (ops room, issue 13)
            os.unlink(call_dir / "settled")
        os.rmdir(call_dir)  # OSError (ENOTEMPTY) when it holds anything
        os.mkdir(call_dir, 0o700)
    os.chmod(call_dir, 0o700)
