"""``dsh run``: run a command in a session, print its output live, exit with its status.

Theory of operation: subscribe to the session's lane first (a command that finishes at once
still shows in it), submit with ``tool.run`` (pre-approved unless ``--ask``), then four small
tasks report to the command through ONE bounded channel of events and never touch each
other's state:

- ``_on_interrupt``: Ctrl-C detaches (``Detach``); with ``--cancel-on-interrupt`` the first
  one sends ``tool.cancel`` (``Cancelling``) and the second detaches;
- ``_follow``: each lane view feeds the call's ``CompleteOutput`` and prints what is new; it
  reports the approval the call waits for (``Waits``, with ``--ask``) and that the call left
  the lane (``Settled``), or a closed stdout (``Detach``);
- ``_keep_up``: polls the spill file while the output comes from there (``client.cli.output``);
- ``_wait_result``: ``tool.wait`` (``Result``).

``_decide`` alone reads the channel and holds the state (the result, the approval waited for,
whether we cancel): after the result it gives the lane ``SETTLE_GRACE_S`` to show the call
settle (the last output may come just after the result), then ``_conclude`` prints the rest
and returns the status (``client.exits``). A reused ``--call-id`` runs nothing again: a note
says so and the existing call's result is shown. When dshd goes away after the submission the
error is a ``CallLost`` (exit 75, and a line naming ``dsh wait``).
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import sys
from dataclasses import dataclass
from typing import Any, AsyncIterator

import anyio
import click
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from client.api import CallLost, Client
from client.cli.common import Options, execute, pass_options
from client.cli.output import drain, finish_call, keep_up
from client.cli.terminal import emit_bytes, note, silence_stdout
from client.exits import EXIT_NEVER_RAN, detached_status, run_status, single
from client.paths import ID_CHARS, is_valid_id
from client.spill import CompleteOutput
from client.subscription import Subscription
from client.transport import ConnectionLost
from protocol.lane import ToolResult
from protocol.methods import MAX_TITLE_CHARS
from protocol.rpc import STORAGE_FAILURE, RpcError

__all__ = ["run", "run_command", "command_string", "RunOptions", "SETTLE_GRACE_S"]

#: After ``tool.wait`` answered, how long the stream may take to show the call settle.
SETTLE_GRACE_S = 2.0
#: Events in flight between the tasks and ``_decide`` (each task sends a handful at most).
EVENT_BOUND = 16
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
POLICIES = ("ask", "never")


@dataclass(frozen=True)
class RunOptions:
    """How ``dsh run`` submits: ``ask`` (not pre-approved) and a new session's settings."""

    ask: bool = False
    sandbox: str | None = None
    policy: str | None = None


@dataclass(frozen=True)
class Call:
    session_id: str
    call_id: str


# ---------------------------------------------------------------------- events
@dataclass(frozen=True)
class Detach:
    why: str  # "interrupt" | "pipe"


@dataclass(frozen=True)
class Cancelling:
    pass


@dataclass(frozen=True)
class Waits:
    approval_id: str | None


@dataclass(frozen=True)
class Settled:
    pass


@dataclass(frozen=True)
class Result:
    result: ToolResult


RunEvent = Detach | Cancelling | Waits | Settled | Result
Events = MemoryObjectSendStream[RunEvent]


@dataclass(frozen=True)
class Followed:
    """How following ended: the result (None when detached first) and what we knew."""

    result: ToolResult | None
    detached: str = ""
    waiting: str | None = None
    cancelling: bool = False


# ---------------------------------------------------------------------- helpers
def command_string(argv: tuple[str, ...] | list[str]) -> str:
    """The shell command for ``argv``: one argument as is (``'make | tee x'``), else shlex.join."""
    return argv[0] if len(argv) == 1 else shlex.join(argv)


def title_of(command: str) -> str:
    """A new session's title for ``command``: the command, cut to the daemon's cap."""
    if len(command) <= MAX_TITLE_CHARS:
        return command
    return command[: MAX_TITLE_CHARS - 1] + "…"


def approval_of(view: Any, call_id: str) -> str | None:
    """The id of the pending approval request of ``call_id`` in a lane view, if any."""
    approvals = view.get("approvals") if isinstance(view, dict) else None
    for approval_id, request in (approvals if isinstance(approvals, dict) else {}).items():
        if isinstance(request, dict) and request.get("callId") == call_id:
            return approval_id
    return None


# ---------------------------------------------------------------------- the command
async def run_command(client: Client, argv: tuple[str, ...], session_id: str | None,
                      timeout: float | None, call_id: str | None, cancel_on_interrupt: bool,
                      how: RunOptions) -> int:
    command = command_string(argv)
    if session_id is None:
        session_id = await client.create_session(os.getcwd(), title=title_of(command),
                                                 sandbox=how.sandbox, approval_policy=how.policy)
    call = Call(session_id, call_id or "c" + secrets.token_hex(8))
    out = CompleteOutput(call.call_id)
    sub = await client.subscribe(session_id)
    note(f"session {call.session_id} call {call.call_id}")
    try:
        followed = await _submit_and_follow(client, sub, call, out, command, timeout, how,
                                            cancel_on_interrupt)
    except BaseException as raised:  # noqa: BLE001 - re-raised, with the hint when dshd left
        lost = single(raised)
        if isinstance(lost, ConnectionLost) and not isinstance(lost, CallLost):
            raise CallLost(lost, call.session_id, call.call_id) from raised
        raise
    finally:
        with anyio.move_on_after(1, shield=True):
            await sub.aclose()
    if isinstance(followed, int):
        return followed
    return await _conclude(call, out, followed)


async def _submit_and_follow(client: Client, sub: Subscription, call: Call, out: CompleteOutput,
                             command: str, timeout: float | None, how: RunOptions,
                             cancel_first: bool) -> Followed | int:
    """Submit and follow the call until its result (or a detach); an int: it never ran."""
    send, receive = anyio.create_memory_object_stream[RunEvent](EVENT_BOUND)
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_on_interrupt, signals, client, call, cancel_first, send.clone())
            never_ran = await _submit(client, call, command, timeout, how)
            if never_ran is not None:
                tasks.cancel_scope.cancel()
                return never_ran
            tasks.start_soon(_follow, sub, out, call, how.ask, send.clone())
            tasks.start_soon(_keep_up, out, send.clone())
            tasks.start_soon(_wait_result, client, call, send.clone())
            followed = await _decide(receive, call)
            tasks.cancel_scope.cancel()
    return followed


async def _submit(client: Client, call: Call, command: str, timeout: float | None,
                  how: RunOptions) -> int | None:
    """``tool.run``; the exit status when the call could not even be logged (it never ran)."""
    try:
        started = await client.start_tool(call.session_id, command, call_id=call.call_id,
                                          timeout=timeout, approved=not how.ask)
    except RpcError as exc:
        if exc.code != STORAGE_FAILURE:
            raise
        note(f"dsh: STORAGE_FAILURE: {exc.message}")
        return EXIT_NEVER_RAN
    if started.existing:
        note(f"dsh: call {call.call_id} already exists in session {call.session_id}: showing "
             "its result; nothing was run again (use a new --call-id to run again)")
    return None


# ---------------------------------------------------------------------- the tasks
async def _on_interrupt(signals: AsyncIterator[int], client: Client, call: Call,
                        cancel_first: bool, events: Events) -> None:
    async with events:
        cancelling = False
        async for _ in signals:
            if cancel_first and not cancelling:
                cancelling = True
                note("dsh: cancelling the command (Ctrl-C again to detach)")
                await events.send(Cancelling())
                try:
                    await client.cancel(call.session_id, call.call_id)
                except RpcError as exc:
                    note(f"dsh: {exc.message}")
                continue
            await events.send(Detach("interrupt"))
            return


async def _follow(sub: Subscription, out: CompleteOutput, call: Call, ask: bool,
                  events: Events) -> None:
    async with events:
        waiting: str | None = None
        try:
            async for view in sub:
                out.update(sub.mirror.last_ops, view)
                await drain(out, emit_bytes)
                approval_id = approval_of(view, call.call_id) if ask else None
                if approval_id != waiting:
                    waiting = approval_id
                    await events.send(Waits(approval_id))
                if out.settled:
                    await events.send(Settled())
                    return
        except BrokenPipeError:
            await events.send(Detach("pipe"))


async def _keep_up(out: CompleteOutput, events: Events) -> None:
    async with events:
        try:
            await keep_up(lambda: [(out, emit_bytes)])
        except BrokenPipeError:
            await events.send(Detach("pipe"))


async def _wait_result(client: Client, call: Call, events: Events) -> None:
    async with events:
        await events.send(Result(await client.wait(call.session_id, call.call_id)))


async def _decide(events: MemoryObjectReceiveStream[RunEvent], call: Call) -> Followed:
    """Read the tasks' events until the call settled after its result, or a detach."""
    result: ToolResult | None = None
    waiting: str | None = None
    asked = settled = cancelling = False
    with anyio.CancelScope() as grace:  # its deadline is set once the result is in
        while result is None or not settled:
            event = await events.receive()
            if isinstance(event, Detach):
                return Followed(None, event.why, waiting, cancelling)
            if isinstance(event, Cancelling):
                cancelling = True
            elif isinstance(event, Waits):
                waiting = event.approval_id
                if waiting and not asked:
                    asked = True
                    note(f"dsh: call {call.call_id} waits for approval {waiting}: answer with "
                         f"`dsh approve {call.session_id} {waiting}` (--reject to refuse) or "
                         f"`dsh attach --approve {call.session_id}`")
            elif isinstance(event, Settled):
                settled = True
            elif isinstance(event, Result):
                result = event.result
                grace.deadline = anyio.current_time() + SETTLE_GRACE_S
    return Followed(result, "", waiting, cancelling)


async def _conclude(call: Call, out: CompleteOutput, followed: Followed) -> int:
    """Print the end (or why we left before it) and return the exit status."""
    if followed.detached or followed.result is None:
        if followed.waiting:
            note(f"detached; the call still waits for approval {followed.waiting} (`dsh approve "
                 f"{call.session_id} {followed.waiting}`). Re-attach: dsh attach "
                 f"{call.session_id}")
        else:
            note(f"detached; the command keeps running. Re-attach: dsh attach {call.session_id}")
        if followed.detached == "pipe":
            silence_stdout()
        return detached_status(followed.detached == "pipe")
    status = await finish_call(out, followed.result)
    if followed.result.error_code == "APPROVAL_UNAVAILABLE":
        note(f"dsh: keep an answerer attached (`dsh attach --approve --follow {call.session_id}`"
             f" in another terminal), then run it again with `dsh run --ask --session "
             f"{call.session_id}`")
    return run_status(status, cancelled_by_user=followed.cancelling)


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--session", "session_id", metavar="ID", help="Run in this session (default: a new one).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="Kill the command after S seconds (exit 124).")
@click.option("--call-id", metavar="ID", help="Idempotency key within a session: with --session, a call with this id runs once (without --session every run makes a new session, so the key protects nothing).")
@click.option("--cancel-on-interrupt", is_flag=True,
              help="On Ctrl-C, cancel the command instead of detaching from it.")
@click.option("--ask", is_flag=True,
              help="Do not pre-approve: wait for an answerer's decision, like a model's call.")
@click.option("--sandbox", type=click.Choice(SANDBOX_MODES), default=None,
              help="Sandbox mode of the new session (default: the daemon's config).")
@click.option("--policy", type=click.Choice(POLICIES), default=None,
              help="Approval policy of the new session (default: the daemon's config).")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
@pass_options
def run(opts: Options, session_id: str | None, timeout: float | None, call_id: str | None,
        cancel_on_interrupt: bool, ask: bool, sandbox: str | None, policy: str | None,
        argv: tuple[str, ...]) -> None:
    """Run CMD in a session and print its output live; exit with its exit code.

    Options come first: everything after `--` (or from the first word that is not an option)
    is the command; an unknown option is an error. The output is printed complete, even when
    it outruns the live window: from then on it is copied byte for byte from the call's spill
    file. Output that fits the window is dshd's cleaned text (NUL and control characters other
    than tab, newline and ESC dropped; invalid UTF-8 shown as U+FFFD).
    Ctrl-C detaches: the command keeps running (re-attach with `dsh attach SESSION`).

    \b
    Exit status (never 0 when the call is an error):
      N    the command's exit code
      124  TOOL_TIMEOUT: killed after --timeout
      130  TOOL_CANCELLED and the command exited 0 (else its own code);
           Ctrl-C (detached, or --cancel-on-interrupt)
      125  the call did not run (--ask and rejected, nobody to ask, no sandbox,
           STORAGE_FAILURE, TOOL_NOT_STARTED, ...)
      75   TOOL_OUTCOME_UNKNOWN: dshd crashed while it ran; it may or may not
           have run (check before retrying); also when dshd went away under
           dsh run (after a restart, `dsh wait SESSION CALL` tells)
      1    any other errorCode with exit code 0; a request refused by dshd
           (e.g. a session directory you cannot enter)
      2    a usage error, or dshd is not running (or does not answer)
      141  stdout was closed (detached)
    """
    if call_id is not None and not is_valid_id(call_id):
        raise click.BadParameter(f"ids match {ID_CHARS}", param_hint="--call-id")
    if session_id is not None and (sandbox or policy):
        raise click.UsageError("--sandbox and --policy set up a new session, not with --session "
                               "(`dsh policy SESSION ask|never` changes a session's policy)")
    how = RunOptions(ask=ask, sandbox=sandbox, policy=policy)
    sys.exit(execute(opts, lambda c: run_command(c, argv, session_id, timeout, call_id,
                                                  cancel_on_interrupt, how)))
