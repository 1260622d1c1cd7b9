"""Following one call over the raw channel: ``dsh run``, ``dsh attach`` of a call, ``dsh wait``.

Theory of operation: the call's output is printed from ``tool.follow`` (``client.raw``): the
bytes the command wrote, at absolute offsets, written to stdout's buffer as they come --
byte-exact at every size, ``\\r`` and colours intact. ``follow_call`` runs a few small tasks
that report through ONE bounded channel of events and never touch each other's state:

- ``_output``: follows from ``offset`` and prints; a ``Gap`` (the per-call disk cap dropped
  bytes) is one line on stderr; the ``End`` (every byte sent, the call ended) is ``OutputDone``.
  dshd makes input and follows of a call that has not started wait for its start; a
  ``NOT_STARTED`` refusal (a dshd that refuses instead) is tried again until the result is
  known; refused for good, the result's window is printed instead, with a line saying so. A closed stdout is ``Detach("pipe")``;
- ``_wait_result``: ``tool.wait`` (``Result``; a STORAGE_FAILURE answer -- the session
  stopped before the result, "ask again" -- is asked again, ``wait_result``);
- input (``KEYS_RULE``): with ``Io.forward`` stdin is read in chunks of at most
  ``INPUT_CHUNK`` and each is one ``tool.write`` (its answer comes once the command's stdin
  took it: the back-pressure), then ``tool.closeStdin`` at its end; with ``Io.raw`` (a tty
  call and a local terminal) every key goes to the command, but the detach sequence
  (``client.cli.keys``) is ``Detach("keys")``;
- ``_resize`` (tty calls on a local terminal): each SIGWINCH is one ``tool.resize``;
- ``_signals``: SIGINT detaches without a PTY (``--cancel-on-interrupt``: the first one
  cancels, ``Cancelling``) and is sent on to the command (``tool.signal INT``) with one;
  SIGTERM and SIGHUP detach (the terminal's mode is restored on the way out).

``_decide`` alone reads the channel: it ends on a detach, or once both the result and the
output's end are in (after the result the output may still be printing a long backlog; it
gives up only when the output made no progress for ``OUTPUT_STALL_S``). The local terminal is
in raw mode (``client.cli.localterm``) exactly while following; lines printed meanwhile end in
``\\r\\n`` and start on a line of their own (``callstate.say``). On the way out (a detach, the
command's end, a signal) the modes the output turned on -- the alternate screen, a hidden
cursor, mouse reporting, bracketed paste, application keys -- are turned off again before
dsh's last line (``_give_back``, ``client.cli.termmodes``).

Across a daemon restart: the tasks above are ONE connection's (``_attempt``). When they end
because that connection was lost (``client.link.Link.lost``: a stop, a crash), ``follow_call``
gets a new one (``Link.reconnect``: bounded back-off, one line each way; a signal meanwhile
detaches) and starts them again on it, with the same ``OutputState`` and ``Followed``: the
follow goes on from ``position``, the byte printed through (so no byte is printed twice and
none is missing), ``tool.wait`` is asked again, stdin goes on from what was not read yet
(``input_done``: its end was already passed on; a ``tool.write`` in flight at the loss is not
sent again -- it may have reached the command -- and a line says so), and a tty call gets
this terminal's size again (one ``tool.resize``) and the keys; the local terminal stays raw.
"""

from __future__ import annotations

import contextlib
import json
import signal
from contextlib import nullcontext
from typing import Awaitable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from client.api import Client
from client.cli.callstate import (
    Call, Cancelling, Detach, Event, Events, Extra, Followed, Io, OutputDone, OutputState,
    Result, Waits, say,
)
from client.cli.conclude import (
    detach_exit, detach_note, end_notes, left_early, reattach_hint, result_status,
)
from client.cli.keys import DetachScanner
from client.cli.localterm import isatty, raw_terminal, read_input, terminal_size
from client.cli.terminal import emit_bytes
from client.link import Link
from client.raw import Broken, Chunk, End, Gap
from protocol.lane import ToolResult
from protocol.rpc import STORAGE_FAILURE, RpcError

__all__ = ["Call", "Io", "Followed", "OutputState", "Events", "Waits", "follow_call", "replay",
           "wait_result", "call_is_tty", "detach_note", "left_early", "end_notes", "result_status",
           "reattach_hint", "detach_exit", "KEYS_RULE", "INPUT_CHUNK", "OUTPUT_STALL_S",
           "RETRY_S"]

#: The most stdin bytes one ``tool.write`` carries (the daemon's bound, HOST.md §6).
INPUT_CHUNK = 1 << 20
#: The most bytes read from a terminal at once (keys come a few at a time).
KEY_CHUNK = 65536
#: After the result: how long the output may make no progress before we stop waiting for it.
OUTPUT_STALL_S = 10.0
#: How often a follow (or a write) the daemon refused before the call started is tried again.
RETRY_S = 0.25
#: How often in a row a follow the daemon could not read is tried again without progress.
BROKEN_RETRIES = 3
#: ``tool.wait`` answered STORAGE_FAILURE: asked again this often, this far apart (``wait_result``).
WAIT_RETRIES = 3
WAIT_RETRY_S = 1.0
EVENT_BOUND = 16
#: -32006: the call settled (HOST.md §6).
NOT_RUNNING = -32006
METHOD_NOT_FOUND = -32601

#: The one rule for keys, shown in ``dsh run --help`` and ``dsh attach --help``.
KEYS_RULE = """\b
Keys and input:
  without -t (no PTY): stdin, when it is not a terminal, is the
    command's stdin (EOF closes it); Ctrl-C detaches: the command
    keeps running (--cancel-on-interrupt: the first Ctrl-C cancels).
  with a PTY (dsh run -t, or dsh attach of a -t call, on a terminal):
    the terminal is raw and every key goes to the command: Ctrl-C
    interrupts it, Ctrl-D is its end of input, Ctrl-Z its job control,
    as under ssh -t or docker run -it. The detach sequence (default
    Ctrl-P Ctrl-Q; --detach-keys, docker's format, e.g. ctrl-a,d; ""
    turns it off) leaves the command running and prints how to
    re-attach; a part of it followed by another key is sent as typed.
    Leaving (a detach, or the command's end) gives the terminal back:
    the alternate screen left, the cursor shown, the mouse, paste and
    keypad modes the command turned on turned off.
    A window resize resizes the command's terminal.
  SIGTERM or SIGHUP to dsh detaches (the terminal is restored)."""



# ---------------------------------------------------------------------- the engine
async def follow_call(link: Link, call: Call, offset: int, io: Io,
                      extra: tuple[Extra, ...] = ()) -> Followed:
    """Follow ``call`` from ``offset`` until its result and output's end, or a detach; across
    a lost connection (a daemon restart) on a new one, from the byte printed through."""
    state = OutputState(position=offset, progress_at=anyio.current_time())
    followed = Followed(None, output=state)
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        with raw_terminal(0) if io.raw else nullcontext():
            state.raw_mode = io.raw
            try:
                while True:
                    try:
                        await _attempt(link.client, call, io, extra, signals, followed)
                        return followed
                    except BaseException as exc:  # noqa: BLE001 - re-raised unless dshd left
                        if not link.lost(exc):
                            raise
                    if not await _reconnect(link, call, signals, followed):
                        return followed  # detached while dshd was away
            finally:
                state.raw_mode = False
                if io.raw:
                    _give_back(state)


def _give_back(state: OutputState) -> None:
    """The local terminal as it was before the command: the modes its output turned on
    turned off (``client.cli.termmodes``), before the line that says why dsh left."""
    if isatty(1):
        with contextlib.suppress(OSError, ValueError):
            emit_bytes(state.modes.restore(state.line_open))
            state.line_open = False


async def _attempt(client: Client, call: Call, io: Io, extra: tuple[Extra, ...], signals,
                   followed: Followed) -> None:
    """One connection's share of following: the tasks of the module doc, until ``_decide``
    is done (a task that fails, e.g. on the connection's end, ends it with its error)."""
    state = followed.output
    send, receive = anyio.create_memory_object_stream[Event](EVENT_BOUND)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_signals, signals, client, call, io, followed, send.clone())
        for task in extra:
            tasks.start_soon(task, client, send.clone())
        tasks.start_soon(_output, client, call, state, send.clone())
        tasks.start_soon(_wait_result, client, call, send.clone())
        if io.raw:
            tasks.start_soon(_keys, client, call, io, state, send.clone())
            tasks.start_soon(_resize, client, call, send.clone())
        elif io.forward and not state.input_done:
            tasks.start_soon(_forward_stdin, client, call, state, send.clone())
        await _decide(receive, followed)
        tasks.cancel_scope.cancel()


async def _reconnect(link: Link, call: Call, signals, followed: Followed) -> bool:
    """A new connection (``Link.reconnect``); False when a signal detached meanwhile. After
    it: the input lost in flight is said, a tty call gets this terminal's size again."""
    state = followed.output

    async def detach_on_signal(scope: anyio.CancelScope) -> None:
        async for signum in signals:
            why = "interrupt" if signum == signal.SIGINT else "signal"
            followed.detached = Detach(why, 0 if why == "interrupt" else signum)
            scope.cancel()
            return

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(detach_on_signal, tasks.cancel_scope)
        client = await link.reconnect(lambda text: say(state, text),
                                      back=f"dsh: dshd is back; following call {call.call_id} "
                                           f"from byte {state.position}")
        tasks.cancel_scope.cancel()
    if followed.detached is not None:
        return False
    state.progress_at = anyio.current_time()
    if state.input_in_flight:
        say(state, f"dsh: {state.input_in_flight} bytes of input were in flight when dshd went "
                   "away; they may or may not have reached the command (not sent again)")
        state.input_in_flight = 0
    if state.raw_mode:
        cols, rows = terminal_size()
        with contextlib.suppress(RpcError):
            await client.resize(call.session_id, call.call_id, cols, rows)
    return True


async def _signals(signals, client: Client, call: Call, io: Io, followed: Followed,
                   events: Events) -> None:
    state = followed.output
    async with events:
        cancelling = followed.cancelling
        async for signum in signals:
            if signum != signal.SIGINT:
                await events.send(Detach("signal", signum))
                return
            if io.tty:
                await _quiet(client, client.send_signal(call.session_id, call.call_id, "INT"),
                             state)
                continue
            if io.cancel_on_interrupt and not cancelling:
                cancelling = True
                say(state, "dsh: cancelling the command (Ctrl-C again to detach)")
                await events.send(Cancelling())
                await _quiet(client, client.cancel(call.session_id, call.call_id), state)
                continue
            await events.send(Detach("interrupt"))
            return


async def _quiet(client: Client, request: Awaitable[object], state: OutputState) -> None:
    try:
        await request
    except RpcError as exc:
        if client.connection.closed:
            raise  # the connection ended: the answer says nothing about the call
        say(state, f"dsh: {exc.message}")


async def _open_follow(client: Client, call: Call, state: OutputState):
    """``tool.follow``, tried again while the call has not started (module doc)."""
    while True:
        try:
            return await client.follow_output(call.session_id, call.call_id, state.position)
        except RpcError as exc:
            if client.connection.closed:
                raise  # dshd went away: its last answer says nothing about the call
            if exc.code == METHOD_NOT_FOUND or state.result_known:
                state.error = exc.message
                return None
        await anyio.sleep(RETRY_S)


async def _output(client: Client, call: Call, state: OutputState, events: Events) -> None:
    async with events:
        try:
            await _print_follow(client, call, state, retry=True)
        except BrokenPipeError:
            await events.send(Detach("pipe"))
            return
        await events.send(OutputDone(state.error))


async def _print_follow(client: Client, call: Call, state: OutputState, *, retry: bool) -> None:
    """Print from ``state.position`` to the end; a ``Broken`` log is followed again, at most
    ``BROKEN_RETRIES`` times in a row without progress (then ``state.error`` says why)."""
    broken = 0
    while True:
        if retry:
            follow = await _open_follow(client, call, state)
        else:
            try:
                follow = await client.follow_output(call.session_id, call.call_id,
                                                    state.position)
            except RpcError as exc:
                follow, state.error = None, exc.message
        if follow is None:
            return
        async with follow:
            async for item in follow:
                state.progress_at = anyio.current_time()
                if isinstance(item, Chunk):
                    emit_bytes(item.data)
                    if state.raw_mode:
                        state.modes.feed(item.data)
                    if item.data:
                        state.line_open = not item.data.endswith(b"\n")
                    state.position = follow.position
                    broken = 0
                elif isinstance(item, Gap):
                    _gap(state, item)
                elif isinstance(item, End):
                    return
                elif isinstance(item, Broken):
                    broken += 1
                    if broken > BROKEN_RETRIES:
                        state.error = item.message
                        return
                    state.position = item.offset
        await anyio.sleep(RETRY_S)


def _gap(state: OutputState, gap: Gap) -> None:
    state.dropped += gap.to - gap.start
    state.gaps += 1
    state.position = gap.to
    if state.gaps == 1:
        say(state, f"dsh: bytes {gap.start}..{gap.to} of the output were dropped by the "
                   f"per-call disk cap (spill_max_bytes); the output goes on from byte {gap.to}")


async def _wait_result(client: Client, call: Call, events: Events) -> None:
    async with events:
        await events.send(Result(await wait_result(client, call)))


async def wait_result(client: Client, call: Call, timeout: float | None = None) -> ToolResult:
    """``tool.wait``; a ``STORAGE_FAILURE`` answer ("the session stopped before the result
    was recorded; ask again": a daemon stopping, or a session that crashed and reopens from
    its log) is asked again up to ``WAIT_RETRIES`` times -- a stopping daemon closes the
    connection meanwhile, which the caller's link takes for a restart."""
    for attempt in range(WAIT_RETRIES + 1):
        try:
            return await client.wait(call.session_id, call.call_id, timeout)
        except RpcError as exc:
            if exc.code != STORAGE_FAILURE or attempt == WAIT_RETRIES:
                raise
        await anyio.sleep(WAIT_RETRY_S)
    raise AssertionError("unreachable: the last attempt returns or raises")


def not_started(exc: RpcError) -> bool:
    """The daemon's ``NOT_STARTED``: the call waits for its approval or checkpoint."""
    return isinstance(exc.data, dict) and exc.data.get("code") == "NOT_STARTED"


async def _write(client: Client, call: Call, data: bytes, state: OutputState) -> bool:
    """One ``tool.write`` (tried again while the call has not started); False: stop input."""
    while True:
        state.input_in_flight = len(data)
        try:
            await client.write_input(call.session_id, call.call_id, data)
            state.input_in_flight = 0
            return True
        except RpcError as exc:
            if client.connection.closed:
                raise  # dshd went away (``_reconnect`` says what was in flight)
            state.input_in_flight = 0
            if not not_started(exc) or state.result_known:
                if exc.code != NOT_RUNNING and not state.result_known:
                    say(state, f"dsh: input not forwarded: {exc.message}")
                return False
        await anyio.sleep(RETRY_S)


async def _forward_stdin(client: Client, call: Call, state: OutputState,
                         events: Events) -> None:
    async with events:
        while True:
            data = await read_input(0, INPUT_CHUNK)
            if not data:
                break
            if not await _write(client, call, data, state):
                state.input_done = True  # refused for good: not again on a new connection
                return
        while True:
            try:
                await client.close_input(call.session_id, call.call_id)
                state.input_done = True
                return
            except RpcError as exc:
                if client.connection.closed:
                    raise
                if not not_started(exc) or state.result_known:
                    if exc.code != NOT_RUNNING and not state.result_known:
                        say(state, f"dsh: could not close the command's stdin: {exc.message}")
                    return
            await anyio.sleep(RETRY_S)


async def _keys(client: Client, call: Call, io: Io, state: OutputState, events: Events) -> None:
    async with events:
        scanner = DetachScanner(io.detach_keys)
        while True:
            data = await read_input(0, KEY_CHUNK)
            if not data:
                await events.send(Detach("signal", signal.SIGHUP))  # the terminal went away
                return
            keys, detach = scanner.feed(data)
            if keys and not await _write(client, call, keys, state):
                return
            if detach:
                await events.send(Detach("keys"))
                return


async def _resize(client: Client, call: Call, events: Events) -> None:
    async with events:
        with anyio.open_signal_receiver(signal.SIGWINCH) as winches:
            async for _ in winches:
                cols, rows = terminal_size()
                try:
                    await client.resize(call.session_id, call.call_id, cols, rows)
                except RpcError:
                    return  # settled: nothing left to resize


async def _decide(events: MemoryObjectReceiveStream[Event], followed: Followed) -> None:
    """Read the events of one connection's tasks into ``followed`` until a detach, or until
    both the result and the output's end are in (module doc)."""
    state = followed.output
    done = False
    while followed.result is None or not done:
        if followed.result is not None and \
                anyio.current_time() - state.progress_at >= OUTPUT_STALL_S:
            state.error = (f"the output stopped at byte {state.position} and its end did "
                           f"not come within {OUTPUT_STALL_S:g} s")
            break
        event: Event | None = None
        with anyio.move_on_after(1):
            event = await events.receive()
        if event is None:
            continue
        if isinstance(event, Detach):
            followed.detached = event
            return
        if isinstance(event, Cancelling):
            followed.cancelling = True
        elif isinstance(event, Waits):
            followed.waiting = event.approval_id
        elif isinstance(event, OutputDone):
            done = True
        elif isinstance(event, Result):
            followed.result = event.result
            state.result_known = True
            state.progress_at = anyio.current_time()


async def replay(client: Client, call: Call, state: OutputState | None = None) -> OutputState:
    """Print a settled call's output from ``state.position`` (default: byte 0) to its end
    (``dsh wait``); ``state`` says how far it got when the connection was lost meanwhile."""
    state = state or OutputState(result_known=True)
    await _print_follow(client, call, state, retry=False)
    return state


def call_is_tty(entry: object) -> bool:
    """Whether a lane entry's call runs under a PTY (its bash arguments say ``tty: true``)."""
    args = entry.get("args") if isinstance(entry, dict) else None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return False
    return isinstance(args, dict) and args.get("tty") is True
