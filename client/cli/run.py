"""``dsh run``: run a command in a session, print its output live, exit with its status.

Theory of operation: everything that can be checked before connecting is checked first
(``client.cli.runargs``: the command, ``--timeout``, ``--env``/``--env-file``, ``--name``, the
working directory), so a refused run never leaves an empty session. The session is
``--session`` (resolved by ``client.cli.sessionref``), or the one named exactly ``--name``
(``session.find``; none: a new session gets the name), else a new one of this directory
(``--title``, else the command); a new session that cannot be made durable is exit 125 with
nothing made. An existing session gets ``--sandbox`` as an audited ``session.setSandbox``
(said on stderr). The call carries ``--env`` as bash's ``arguments.env``; the client's own
environment is never passed. Then submit with ``tool.run``
(pre-approved unless ``--ask``; with ``-t`` under a PTY of the local terminal's size, else
with ``stdin: "pipe"`` when stdin is not a terminal), then follow the call over the raw
channel from its first byte (``client.cli.stream.follow_call``: the output byte for byte,
stdin or the keys to the command, resizes, the detach rules of ``KEYS_RULE``). With ``--ask``
a lane subscription tells which approval the call waits for (one line, how to answer it).
``_conclude`` prints the end -- or how to re-attach after a detach -- and returns the status
(``client.exits``). A reused ``--call-id`` runs nothing again: a note says so and the existing
call's output and result are shown; the same id with another command or env is the
daemon's ``CALL_ID_REUSED`` (one line, exit 2, nothing run). ``--json`` follows no output:
it waits for the result and prints the ToolResult as one line of JSON. A closed stdout pipe
(``| head``) is a detach even when the command writes nothing more (``_stdout_closed``): the
command keeps running, as with every detach of dsh run, and one line says how to re-attach
or cancel it -- cancelling would turn a reader's ``head`` into a lost build, and the whole
output stays in the call's log for ``dsh attach``. When dshd goes away after the submission, dsh connects
again (``client.link``, ``--reconnect-timeout``) and goes on following from the byte printed
through; ``--ask``'s subscription is made again on the new connection. Only when dshd does
not come back in time (or ``--reconnect-timeout 0``) is the error a ``CallLost`` (exit 75, and
a line naming ``dsh wait``).

``-t`` is never implied: ``dsh run`` always runs a command, and both ``docker run`` (explicit
``-t``) and ``ssh host CMD`` (a PTY only with ``-t``) give a command pipes unless asked; a
PTY also changes the bytes (``\n`` becomes ``\r\n``, programs colour and page), which must
not depend on where dsh happens to be started.
"""

from __future__ import annotations

import os
import secrets
import select
import stat
import shlex
import sys
from dataclasses import dataclass
from typing import Any

import anyio
import click

from client.api import CallLost, Client
from client.cli.askopt import ask_timeout_option
from client.cli.common import (
    RECONNECT_RULE, Options, execute_linked, pass_options, reconnect_option,
)
from client.cli.keys import DEFAULT_DETACH_KEYS, detach_keys_option
from client.cli.localterm import isatty, stdin_usable, terminal_size
from client.cli.callstate import Detach
from client.cli.stream import (
    KEYS_RULE, Call, Events, Followed, Io, Waits, follow_call, left_early,
    result_status, wait_result,
)
from client.cli.runargs import (
    ENV_RULE, NAME_CHARS, TIMEOUT, call_env, check_command, current_dir, is_valid_name,
)
from client.cli.sessionref import SESSION_REF, resolve_session
from client.cli.terminal import note, print_json
from client.exits import EXIT_DAEMON_NOT_RUNNING as EXIT_USAGE
from client.exits import EXIT_NEVER_RAN, exit_status, run_status, single
from client.link import Link, ride
from client.paths import ID_CHARS, is_valid_id
from client.subscription import Subscription
from client.transport import ConnectionLost
from protocol.methods import MAX_TITLE_CHARS
from protocol.rpc import INVALID_PARAMS, SESSION_NOT_FOUND, STORAGE_FAILURE, RpcError

__all__ = ["run", "run_command", "command_string", "RunOptions", "io_for", "RUN_HELP"]

#: Seconds between two checks that stdout's reader is still there (``_stdout_closed``).
PIPE_CHECK_S = 0.25
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
POLICIES = ("ask", "never")


@dataclass(frozen=True)
class RunOptions:
    """How ``dsh run`` submits: ``ask`` (not pre-approved), a new session's settings (``name``,
    ``title``, ``policy``; ``sandbox``, which an existing session is changed to), the call's
    ``env``, and ``json`` (print the result as JSON instead of the output)."""

    ask: bool = False
    sandbox: str | None = None
    policy: str | None = None
    ask_timeout: float | None = None
    env: dict[str, str] | None = None
    name: str | None = None
    title: str | None = None
    json: bool = False
    #: Where a new session works (None: --session names one, nothing is made).
    cwd: str | None = None


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
def io_for(tty: bool, detach_keys: bytes, cancel_on_interrupt: bool) -> Io:
    """How this ``dsh run`` talks to its call (``KEYS_RULE``)."""
    terminal = isatty(0)
    return Io(tty=tty, raw=tty and terminal, forward=not terminal and stdin_usable(0),
              detach_keys=detach_keys if tty else b"", cancel_on_interrupt=cancel_on_interrupt)


async def run_command(link: Link, argv: tuple[str, ...], session_id: str | None,
                      timeout: float | None, call_id: str | None, cancel_on_interrupt: bool,
                      how: RunOptions, tty: bool = False,
                      detach_keys: bytes = b"") -> int:
    client = link.client
    command = command_string(argv)
    try:
        session_id = await session_for(client, session_id, command, how)
    except _Refused as refused:
        note(f"dsh: {refused}")
        return EXIT_USAGE
    if session_id is None:
        return EXIT_NEVER_RAN
    call = Call(session_id, call_id or "c" + secrets.token_hex(8))
    io = io_for(tty, detach_keys, cancel_on_interrupt)
    asks = _Asks(call, client, await client.subscribe(session_id)) if how.ask else None
    try:
        never_ran = await _submit(client, call, command, timeout, how, io)
        if never_ran is not None:
            return never_ran
        if how.json:
            return await _json_result(link, call)
        extra = (_stdout_closed,) + (() if asks is None else (asks.run,))
        followed = await follow_call(link, call, 0, io, extra)
    except BaseException as raised:  # noqa: BLE001 - re-raised, with the hint when dshd left
        lost = single(raised)
        if isinstance(lost, ConnectionLost) and not isinstance(lost, CallLost):
            raise CallLost(lost, call.session_id, call.call_id) from raised
        raise
    finally:
        if asks is not None:
            with anyio.move_on_after(1, shield=True):
                await asks.sub.aclose()
    return _conclude(call, followed, io)


async def session_for(client: Client, session_id: str | None, command: str,
                      how: RunOptions) -> str | None:
    """The session to run in: ``--session``, the one named ``--name``, else a new one (None:
    it could not be made durable, after the line saying so). An existing session's sandbox
    is changed to ``--sandbox`` first (an audited ``sandbox/mode`` event)."""
    if session_id is not None:
        session_id = await resolve_session(client, session_id)
    elif how.name is not None:
        session_id = await named_session(client, how.name)
    if session_id is None:
        assert how.cwd is not None
        extra = {"name": how.name} if how.name is not None else {}
        try:
            return await client.create_session(how.cwd, title=how.title or title_of(command),
                                               sandbox=how.sandbox, approval_policy=how.policy,
                                               **extra)
        except RpcError as exc:
            if exc.code != STORAGE_FAILURE:
                raise
            note(f"dsh: STORAGE_FAILURE: {exc.message}; no session was made, nothing ran")
            return None
    if how.policy is not None:
        raise _Refused(f"--policy sets up a new session; session {session_id} exists "
                       f"(`dsh policy {session_id} ask|never` changes its policy)")
    if how.sandbox is not None:
        await client.set_sandbox(session_id, how.sandbox)
        note(f"dsh: session {session_id}: sandbox is now {how.sandbox} (recorded as a "
             "sandbox/mode change)")
    return session_id


async def named_session(client: Client, name: str) -> str | None:
    """The id of the session named exactly ``name`` (``session.find``), None when none is."""
    try:
        found, how = await client.find_session(name, None)
    except RpcError as exc:
        if exc.code == SESSION_NOT_FOUND:
            return None  # none, or only prefixes of several: a new session gets the name
        raise
    if how != "name":
        return None  # an id or a prefix, not this name: a new session gets it
    note(f"dsh: using session {found} ({name})")
    return found


async def _json_result(link: Link, call: Call) -> int:
    """``--json``: the call's ToolResult as one line of JSON on stdout; its status."""
    result = await ride(link, lambda c: wait_result(c, call), note)
    print_json(result)
    return exit_status(result)[0]


async def _submit(client: Client, call: Call, command: str, timeout: float | None,
                  how: RunOptions, io: Io) -> int | None:
    """``tool.run``; the exit status when the call could not even be logged (it never ran)."""
    try:
        started = await client.start_tool(call.session_id, command, call_id=call.call_id,
                                          timeout=timeout, approved=not how.ask,
                                          tty=terminal_size() if io.tty else None,
                                          stdin=io.forward, env=how.env,
                                          ask_timeout=how.ask_timeout if how.ask else None)
    except RpcError as exc:
        if exc.code == INVALID_PARAMS and _data_code(exc) == "CALL_ID_REUSED":
            note(f"dsh: {exc.message}; nothing was run (pick a new --call-id to run another "
                 "command)")
            return EXIT_USAGE
        if exc.code != STORAGE_FAILURE:
            raise
        note(f"dsh: STORAGE_FAILURE: {exc.message}; the session {call.session_id} is kept, "
             "the command did not run")
        return EXIT_NEVER_RAN
    note(f"session {call.session_id} call {call.call_id}")
    if started.existing:
        note(f"dsh: call {call.call_id} already exists in session {call.session_id}: showing "
             "its result; nothing was run again (use a new --call-id to run again)")
    return None


async def _stdout_closed(client: Client, events: Events) -> None:
    """A pipe on stdout whose reader went away (``dsh run ... | head`` once head exited) is a
    detach at once, not only at the next write: the command keeps running (a detach, as
    Ctrl-C's: leaving dsh never ends a command) and one line says how to re-attach or cancel.
    The pipe is checked every ``PIPE_CHECK_S`` (POLLERR on the write end)."""
    async with events:
        if not stat.S_ISFIFO(os.fstat(1).st_mode):
            await anyio.sleep_forever()
        poller = select.poll()
        poller.register(1, 0)  # POLLERR and POLLHUP are always reported
        while not any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0)):
            await anyio.sleep(PIPE_CHECK_S)
        await events.send(Detach("pipe"))


class _Refused(Exception):
    """A usage error found once connected (before anything was made or run)."""


def _data_code(exc: RpcError) -> object:
    data = getattr(exc, "data", None)
    return data.get("code") if isinstance(data, dict) else None


class _Asks:
    """``--ask``'s lane subscription: made before the submission, made again on each new
    connection (``follow_call``'s extra task)."""

    def __init__(self, call: Call, client: Client, sub: Subscription) -> None:
        self.call, self.client, self.sub = call, client, sub

    async def run(self, client: Client, events: Events) -> None:
        if client is not self.client:
            self.client, self.sub = client, await client.subscribe(self.call.session_id)
        await _approvals(self.sub, self.call, events)


async def _approvals(sub: Subscription, call: Call, events: Events) -> None:
    """``--ask``: say once which approval the call waits for; report it (``Waits``)."""
    async with events:
        waiting: str | None = None
        asked = False
        async for view in sub:
            approval_id = approval_of(view, call.call_id)
            if approval_id == waiting:
                continue
            waiting = approval_id
            await events.send(Waits(approval_id))
            if waiting and not asked:
                asked = True
                note(f"dsh: call {call.call_id} waits for approval {waiting}: answer with "
                     f"`dsh approve {call.session_id} {waiting}` (--reject to refuse) or "
                     f"`dsh attach --approve {call.session_id}`; from another terminal: "
                     "`dsh approvals` lists what waits, --allow-for-session allows such "
                     "calls from now on")


def _conclude(call: Call, followed: Followed, io: Io) -> int:
    """Print the end (or why we left before it) and return the exit status."""
    early = left_early(call, followed, io)
    if early is not None:
        return early
    status = result_status(followed)
    if followed.result.error_code == "APPROVAL_UNAVAILABLE":
        note(f"dsh: keep an answerer attached (`dsh attach --approve --follow {call.session_id}`"
             f" in another terminal), then run it again with `dsh run --ask --session "
             f"{call.session_id}`")
    return run_status(status, cancelled_by_user=followed.cancelling)


RUN_HELP = """Run CMD in a session and print its output live; exit with its exit code.

\b
The session: a new one in this directory (titled by the command or --title),
or --session SESSION, or --name NAME (the session named NAME, made when
there is none: `dsh run --name build -- make` runs every build in one).
--sandbox with an existing session changes its mode for the calls from now
on (recorded and audited as a sandbox/mode change; said on stderr).

Options come first: everything after `--` (or from the first word that is not an option)
is the command; an unknown option is an error. The output is printed as the command wrote
it, byte for byte and complete (carriage returns, colours, NULs and invalid UTF-8 kept),
from the call's raw log. -t runs CMD under a PTY of this terminal's size (it is never
implied: without it CMD gets pipes, as with docker run and ssh host CMD).

""" + KEYS_RULE + """

""" + RECONNECT_RULE + """

""" + ENV_RULE + """

\b
With --json: nothing of the output is printed; once the call settles its
ToolResult (as `dsh wait --json` prints it) is one line of JSON on stdout.

\b
Exit status (never 0 when the call is an error):
  N    the command's exit code
  124  TOOL_TIMEOUT: killed after --timeout
  130  TOOL_CANCELLED and the command exited 0 (else its own code);
       Ctrl-C (detached, or --cancel-on-interrupt)
  0    detached with the detach sequence (-t)
  129, 143  detached by SIGHUP, SIGTERM
  125  the call did not run (--ask and rejected, nobody to ask, no sandbox,
       STORAGE_FAILURE, TOOL_NOT_STARTED, ...)
  75   TOOL_OUTCOME_UNKNOWN: dshd crashed while it ran and its call host
       is gone too; it may or may not have run (check before retrying);
       also when dshd went away under dsh run and did not come back
       within --reconnect-timeout (`dsh wait SESSION CALL` tells later)
  1    any other errorCode with exit code 0; a request refused by dshd
       (e.g. a session directory you cannot enter)
  2    a usage error (checked before any session is made: an empty
       command, --timeout inf/nan/0/-1/1e308, a bad --env; a --call-id
       reused with another command), or dshd is not running
  141  stdout was closed (`dsh run ... | head`): dsh detached, the command
       keeps running; stderr says how to re-attach or cancel it
"""


@click.command(context_settings={"allow_interspersed_args": False}, help=RUN_HELP)
@click.option("-t", "--tty", "tty", is_flag=True,
              help="Run CMD under a PTY (raw terminal, every key to CMD; see Keys).")
@click.option("--detach-keys", "detach_keys", default=DEFAULT_DETACH_KEYS, show_default=True,
              callback=detach_keys_option, metavar="KEYS",
              help='With -t: the sequence that detaches (docker\'s format; "" for none).')
@click.option("--session", "session_id", type=SESSION_REF, metavar="SESSION",
              help="Run in this session (default: a new one, or the one --name names).")
@click.option("--name", "name", metavar="NAME",
              help="Run in the session named NAME; make it (with that name) when there is none.")
@click.option("--title", "title", metavar="TEXT",
              help="A new session's title (default: the command).")
@click.option("--timeout", type=TIMEOUT, metavar="S",
              help="Kill the command after S seconds (exit 124); 0 < S <= 604800.")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE",
              help="Set KEY in CMD's environment (repeatable; over --env-file and the "
                   "session's env).")
@click.option("--env-file", "env_file", metavar="FILE",
              type=click.Path(exists=True, dir_okay=False),
              help="KEY=VALUE lines (# comments, quotes, `export` allowed; no ${...} expansion).")
@click.option("--call-id", metavar="ID", help="Idempotency key within a session: with --session, a call with this id runs once; the same id with another command or env is refused (without --session every run makes a new session, so the key protects nothing).")
@click.option("--cancel-on-interrupt", is_flag=True,
              help="On Ctrl-C, cancel the command instead of detaching from it.")
@click.option("--ask", is_flag=True,
              help="Do not pre-approve: wait for an answerer's decision, like a model's call.")
@click.option("--sandbox", type=click.Choice(SANDBOX_MODES), default=None,
              help="Sandbox mode of the new session (default: the daemon's config); with "
                   "--session (or an existing --name): change that session's mode, audited.")
@click.option("--policy", type=click.Choice(POLICIES), default=None,
              help="Approval policy of the new session (default: the daemon's config).")
@ask_timeout_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the call's result (ToolResult) as one line of JSON instead of its "
                   "output; the exit status is the same.")
@reconnect_option
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
@pass_options
def run(opts: Options, tty: bool, detach_keys: bytes, session_id: str | None,
        name: str | None, title: str | None, timeout: float | None,
        env_pairs: tuple[str, ...], env_file: str | None, call_id: str | None,
        cancel_on_interrupt: bool, ask: bool, sandbox: str | None, policy: str | None,
        ask_timeout: float, as_json: bool, reconnect_timeout: float,
        argv: tuple[str, ...]) -> None:
    if call_id is not None and not is_valid_id(call_id):
        raise click.BadParameter(f"ids match {ID_CHARS}", param_hint="--call-id")
    check_command(command_string(argv))
    if session_id is not None and (policy or name or title):
        raise click.UsageError("--policy, --name and --title set up a new session, not with "
                               "--session (`dsh policy SESSION ask|never` changes a session's "
                               "policy)")
    if name is not None and not is_valid_name(name):
        raise click.BadParameter(f"names match {NAME_CHARS}", param_hint="--name")
    if title is not None and len(title) > MAX_TITLE_CHARS:
        raise click.BadParameter(f"at most {MAX_TITLE_CHARS} characters", param_hint="--title")
    json_out = as_json or opts.json
    if json_out and tty:
        raise click.UsageError("--json prints the result, not a terminal's output: not with -t")
    how = RunOptions(ask=ask, sandbox=sandbox, policy=policy, env=call_env(env_pairs, env_file),
                     name=name, title=title, json=json_out, ask_timeout=ask_timeout,
                     cwd=current_dir() if session_id is None else None)
    sys.exit(execute_linked(
        opts, lambda link: run_command(link, argv, session_id, timeout, call_id,
                                       cancel_on_interrupt, how, tty, detach_keys),
        reconnect_timeout=reconnect_timeout))
