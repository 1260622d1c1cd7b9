"""One tool call as the daemon holds it while it has not settled, and what it needs of its
session (``dshd.sessions.calls`` has the pipeline; EXEC.md §1, HOST.md §7).

Theory of operation: a :class:`Call` is a handle, not the command: the command is owned by its
call host (one detached process per call) and outlives the daemon's own work. ``stage`` says
where the daemon-side work is (``gate`` → ``barrier`` → ``exec``); its cancel scope covers the
gate and the barrier only. A call rebuilt after a restart (re-adopted, settled from its host's
exit record, or re-asked) is a Call like any other. :class:`CallHost` is the session seen from
the call table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, NamedTuple, Protocol

import trio

from ..execution.capture import OutputCapture
from ..execution.hosted import HostHandle
from ..storage.sidecar import PendingOutput

__all__ = ["AgentSlot", "Call", "CallHost", "CallOutput", "now_ms"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Call:
    """The daemon's handle on a tool call of this daemon run that has not settled (module doc).

    ``stage`` is where its daemon-side work is: ``gate`` → ``barrier`` → ``exec`` (the command
    runs, owned by its call host). ``scope`` covers the gate and the barrier; ``terminate``
    is the request to the host to end it; ``detach`` lets go of it at a daemon stop (the
    command runs on, its approval stays pending). ``host``: the call's ``HostHandle`` once its
    host runs (``record`` set after the end; raw methods such as ``tool.write`` use it).
    ``keeps``: its host was started with ``on_daemon_loss = "keep"`` (it survives a detach)."""

    call_id: str
    name: str
    arguments: dict
    approved: bool
    seq: int  # seq of its tool/call event
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    terminate: trio.Event = field(default_factory=trio.Event)
    stage: Literal["gate", "barrier", "exec"] = "gate"
    capture: OutputCapture | None = None
    synced_version: int = -1
    synced_spill: str | None = None
    pending: PendingOutput | None = None
    host: HostHandle | None = None
    detach: trio.Event = field(default_factory=trio.Event)
    keeps: bool = True
    #: ``tool.run``'s ``askTimeout``: seconds the gate waits for an answerer (0: at once).
    ask_timeout: float = 0.0
    #: Which grace ``ask_timeout`` is (the unavailable sentence's variant): ``timeout``
    #: (``askTimeout``) or ``turn`` (``turn_ask_grace_seconds``, a model-proposed call).
    ask_why: str = "timeout"

    @property
    def detached(self) -> bool:
        return self.detach.is_set()

    @property
    def started(self) -> bool:
        """Its command was handed to its owner (it may have run)."""
        return self.stage == "exec"

    def cancel(self) -> None:
        """Cancel the daemon-side work, or ask the command's owner to end the command."""
        if self.stage == "exec":
            self.terminate.set()
        else:
            self.scope.cancel()


class CallHost(Protocol):
    """What the call table needs of its session (``dshd.sessions.session.Session``)."""

    id: str
    env: dict[str, str]
    mode: str
    owner: int | None

    def accepting(self) -> bool:
        """New work is accepted (the session runs and is not closing)."""
        ...

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run ``fn(*args)`` as a supervised task of the session; SessionClosing if closing."""
        ...

    def crashed(self, exc: BaseException) -> None: ...

    def crash_text(self) -> str | None:
        """The crash that ends the session ("Type: text"), None while it is healthy."""
        ...

    def deadline(self) -> float:
        """The trio time by which the session's wind-down must be over (inf while it runs)."""
        ...


class AgentSlot(Protocol):
    """What a session knows of its agent loop (``dshd.agent.TurnDriver``, made on demand)."""

    def stop(self, policy: str = "cancel") -> None:
        """End the running turn (``interrupted``), or with ``"detach"`` leave a turn that
        waits for its tool calls open in the log, to resume after the start."""
        ...

    def busy(self) -> bool: ...


class CallOutput(NamedTuple):
    """``Session.call_output``: the call dir, the host handle or None, the result or None."""

    dir: Path
    host: Any
    result: dict | None
