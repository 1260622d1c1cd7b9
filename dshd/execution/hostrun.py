"""One call's run through its call host, to an outcome (HOST.md §4, §7).

Theory of operation: :class:`HostRun` drives an attached :class:`~dshd.execution.hostlink.
HostHandle` -- the pump (replies, ``progress``, ``exit``), the log reader that brings the call's
:class:`~dshd.execution.capture.OutputCapture` up to the host's reported end (at once after a
small read, at most once per :data:`READ_INTERVAL` in a flood, per :data:`TURNOVER_INTERVAL`
after a read that turned the window over), and the supervisor: the ``cancel`` event →
``terminate {grace: kill_grace, reason: "cancelled"}``. The exit record → :class:`ExecOutcome`
(:func:`outcome_of`); then ``release`` (the host exits once the record is durable). A
cancellation from outside or an error of the run → ``terminate {grace: 0, reason: "killed"}``,
shielded and bounded, before it propagates.

**Detach** (``on_stop = "detach"``, HOST.md §7): the ``detach`` event ends the run without a
word to the host -- no ``terminate``, no ``release`` -- and closes the connection; the outcome
is ``ExecOutcome(detached=True)`` and the command runs on (its host was started with
``on_daemon_loss = "keep"``). A cancellation that comes after ``detach`` was set kills nothing
either. A host the next daemon adopts (``dshd.execution.hosted.adopt_hosted``) is driven by
the same run: its ``attach`` reply gives the current extent (the capture is rebuilt from the
log, jumping to the window's tail) or the record at once when the command ended meanwhile.

**A host that does not answer** (stopped, wedged, or one that ignores ``attach`` and
``terminate``): every way the run asks the host to end the command is bounded in real time (a
worker thread's clock: the daemon's trio clock, which a test may run virtually, plays no part).
A cancel (``terminate {grace: kill_grace}``) and the call's ``timeout`` (the host ends the
command itself) wait ``kill_grace`` + :data:`CLEANUP_SECONDS` for the exit record; an outside
cancellation waits :data:`CLEANUP_SECONDS`. When none came, the run's ``kill`` (built by
:func:`host_killer`: :func:`~dshd.execution.hostlink.abandon`) SIGKILLs the host, the command's
tree and the run's token carriers, closes the connection, and the outcome is ``cancelled`` /
``timed_out`` with an ``error`` saying the call host did not answer and was killed. ``attach``
runs beside the supervisor, so a cancel is seen while it is unanswered.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import trio

from dshd.callhost import tree
from dshd.execution.capture import OutputCapture, catch_up
from dshd.execution.hostlink import (
    HostHandle, HostRequestError, abandon, host_log_tail, log_reader, record_on_disk, scan_log,
)
from dshd.execution.spawn import RESOURCE_ERRNOS, spawn_sentence

__all__ = ["ExecOutcome", "HostRun", "host_killer", "outcome_of", "settle_capture", "spawn_failed_sentence",
           "wrapper_resource_failure"]

#: Seconds between two reads of the log while output flows (the first one of a burst is at
#: once): the host's own coalescing of progress events.
READ_INTERVAL = 0.02
#: Seconds after a read that turned the window over (it consumed max_bytes or more): the lane
#: publisher spaces such a publish by its size at publish_rate_bytes (a 50 KB turnover waits
#: ~200 ms, EXEC.md §2), so reading sooner would only be overwritten unseen.
TURNOVER_INTERVAL = 0.2
#: A read of less than this is cheap: the next one may come at once (write → mirror latency,
#: EXEC.md §2: lines at 100/s waited for READ_INTERVAL each, p50 22 ms).
SMALL_READ = 64 * 1024
#: Seconds the shielded cleanup after an outside cancellation may take (terminate, wait for the
#: record, a last read, release); also how long past the kill grace a cancel or a timeout waits
#: for the exit record before the host counts as not answering and is killed (module doc).
CLEANUP_SECONDS = 10.0


class ExecOutcome(msgspec.Struct):
    """How a command ended.

    ``exit_code``: the exit status, 128+signal when a signal killed it, None when it never ran
    (spawn failure) or its host died. ``timed_out`` / ``cancelled``: the timeout / the cancel
    event stopped it. ``error``: a sentence for a spawn failure or a host failure (the call is
    an error whatever the exit code). ``detached``: the daemon let go of a running command
    (``on_stop = "detach"``): no outcome yet, the next daemon adopts it.
    """

    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    error: str | None = None
    detached: bool = False


def settle_capture(capture: OutputCapture, on_output: Callable[[], None]) -> None:
    capture.finish()
    on_output()


class HostRun:
    """One call's run through its host: the pump, the log reader, the supervisor (module
    doc). ``kill``: SIGKILLs the host and everything of its command (:func:`host_killer`)
    when it does not answer; None kills nothing (the run still settles)."""

    def __init__(self, handle: HostHandle, capture: OutputCapture, on_output: Callable[[], None],
                 argv: list[str], cwd: str, spare_wrapper: str | None,
                 kill: Callable[[], None] | None = None) -> None:
        self.handle, self.capture, self.on_output = handle, capture, on_output
        self.argv, self.cwd, self.spare_wrapper = argv, cwd, spare_wrapper
        self.reader = log_reader(handle.dir, handle.segment_bytes)
        self.kill = kill
        #: Set once the host was killed for not answering: (reason, the sentence).
        self.gave_up: tuple[str, str] | None = None

    async def run(self, cancel: trio.Event, kill_grace: float,
                  detach: trio.Event | None = None,
                  timeout: float | None = None) -> ExecOutcome:
        """Attach, follow the log, and return the outcome (module doc); ``detach`` set before
        the end returns ``ExecOutcome(detached=True)`` and leaves the command running;
        ``timeout``: the call's, which the host enforces (None: none, or not known)."""
        handle = self.handle
        detach = detach if detach is not None else trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handle.pump)
                async with trio.open_nursery() as reading:
                    reading.start_soon(self._attach_and_read)  # ends once the record is known
                    await self._supervise(cancel, kill_grace, detach, timeout)
                    if detach.is_set():
                        reading.cancel_scope.cancel()  # else it ends with the record
                if detach.is_set() and handle.record is None:
                    nursery.cancel_scope.cancel()
                    record = None
                else:
                    record = handle.record or record_on_disk(handle.dir)
                    await self._last_read(record)
                    with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_SECONDS):
                        if not handle.closed:
                            try:
                                await handle.release()
                            except HostRequestError:
                                pass
                    nursery.cancel_scope.cancel()
        except BaseException:
            if not detach.is_set():  # a detached command runs on: nothing is killed
                with trio.CancelScope(shield=True):
                    await self._kill()  # bounded itself
            if not self.capture.finished:
                settle_capture(self.capture, self.on_output)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await handle.aclose()
            raise
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await handle.aclose()
        if detach.is_set() and handle.record is None and record is None:
            return ExecOutcome(exit_code=None, detached=True)
        if record is None and self.gave_up is not None:
            reason, sentence = self.gave_up
            return ExecOutcome(exit_code=None, cancelled=reason == "cancelled",
                               timed_out=reason == "timeout", error=sentence)
        return outcome_of(record, handle, self.argv, self.cwd, self.spare_wrapper,
                          self.capture.text)

    async def _attach_and_read(self) -> None:
        handle = self.handle
        try:
            reply = await handle.request("attach")
        except HostRequestError:
            pass  # gone at once: the record on disk (or none) says how it ended
        else:
            state = reply.get("state")
            handle.absorb(state if isinstance(state, dict) else reply)
        await self._read()

    async def _supervise(self, cancel: trio.Event, kill_grace: float,
                         detach: trio.Event, timeout: float | None) -> None:
        """Wait for the record (or the end of the connection, or ``detach``); on ``cancel``,
        terminate; a host that does not end the command in time is killed (module doc)."""
        handle = self.handle
        async with trio.open_nursery() as nursery:

            async def on_cancel() -> None:
                await cancel.wait()
                if handle.record is None and not detach.is_set():
                    await self._end_or_kill(kill_grace, "cancelled", ask=True)

            async def on_timeout() -> None:
                await real_sleep(timeout)  # the host's own deadline started before this one
                await self._end_or_kill(kill_grace, "timeout", ask=False)

            async def on_detach() -> None:
                await detach.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(on_cancel)
            nursery.start_soon(on_detach)
            if timeout is not None:
                nursery.start_soon(on_timeout)
            await handle.wait_ended()
            nursery.cancel_scope.cancel()

    async def _end_or_kill(self, grace: float, reason: str, *, ask: bool) -> None:
        """Ask the host to terminate (``ask``), give it ``grace`` + CLEANUP_SECONDS of real
        time to report the end (this task is cancelled when it does), then kill it."""
        seconds = grace + CLEANUP_SECONDS
        async with trio.open_nursery() as nursery:
            if ask:
                nursery.start_soon(self._ask_terminate, grace, reason)
            await real_sleep(seconds)
            nursery.cancel_scope.cancel()
        self._give_up(reason, seconds)
        await self.handle.aclose()  # the supervisor's wait ends, waiting requests fail

    async def _ask_terminate(self, grace: float, reason: str) -> None:
        try:
            await self.handle.terminate(grace, reason)
        except HostRequestError:
            pass  # it ended meanwhile (the record says how), or it does not answer

    def _give_up(self, reason: str, seconds: float) -> None:
        """Kill the host and its command for good (``self.kill``) and say why."""
        if self.gave_up is not None:
            return
        self.gave_up = (reason, (
            f"the call host (pid {self.handle.pid}) did not answer: no end of the command "
            f"was reported within {seconds:g} s of the {_ASKED[reason]}, so the host and the "
            "command's processes were killed (SIGKILL)"))
        if self.kill is not None:
            self.kill()

    async def _read(self) -> None:
        """Bring the capture up to the host's reported end: at once after a small read, at most
        once per READ_INTERVAL in a flood, per TURNOVER_INTERVAL after a turnover."""
        handle, capture = self.handle, self.capture
        while True:
            seen = handle.end_offset
            if seen > capture.read_offset or handle.first_offset > capture.read_offset:
                before = capture.read_offset
                await catch_up(capture, self.reader, seen, handle.first_offset,
                               handle.total_lines)
                self.on_output()
                consumed = capture.read_offset - before
                if consumed >= capture.limits.max_bytes:
                    await trio.sleep(TURNOVER_INTERVAL)
                elif consumed >= SMALL_READ:  # a flood: coalesce; a few lines: read at once
                    await trio.sleep(READ_INTERVAL)
            if handle.record is not None or handle.closed:
                return
            await handle.wait_progress(seen)

    async def _last_read(self, record: dict | None) -> None:
        handle, capture = self.handle, self.capture
        if record is not None:
            end = int(record.get("totalBytes", handle.end_offset))
            first = int(record.get("firstOffset", handle.first_offset))
            lines = int(record.get("totalLines", handle.total_lines))
        else:
            extent = await trio.to_thread.run_sync(scan_log, handle.dir)
            end, first, lines = (max(handle.end_offset, extent.end_offset),
                                 max(handle.first_offset, extent.first_offset), handle.total_lines)
        await catch_up(capture, self.reader, end, first, lines)
        settle_capture(capture, self.on_output)

    async def _kill(self) -> None:
        """Shielded, bounded: the time is up; the host is told to KILL everything of the call
        at once and the record is awaited in a worker thread against the real clock
        (:func:`_await_record`, CLEANUP_SECONDS); then its output is read and the host
        released -- or, with no record, the host is killed with its command (``self.kill``)."""
        handle = self.handle
        if handle.record is None and not handle.closed:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handle.pump)
                nursery.start_soon(self._ask_terminate, 0, "killed")
                record = await trio.to_thread.run_sync(_await_record, handle.dir,
                                                       CLEANUP_SECONDS)
                nursery.cancel_scope.cancel()
            if record is not None and handle.record is None:
                handle.absorb({"record": record})
        if handle.record is None:
            self._give_up("killed", CLEANUP_SECONDS)  # also sweeps what a dead host left
            return
        with trio.move_on_after(CLEANUP_SECONDS):
            try:
                await self._last_read(handle.record)
                if not handle.closed:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(handle.pump)
                        await handle.release()
                        nursery.cancel_scope.cancel()
            except HostRequestError:
                pass


#: What the run asked of the host, per reason (for the sentence of :meth:`HostRun._give_up`).
_ASKED = {"cancelled": "cancel (terminate)", "timeout": "call's timeout",
          "killed": "request to kill the command"}


async def real_sleep(seconds: float) -> None:
    """Sleep ``seconds`` of real time in a worker thread (the daemon's trio clock, which a test
    may run virtually, plays no part); a cancellation ends it at once."""
    stop = threading.Event()
    try:
        await trio.to_thread.run_sync(stop.wait, seconds, abandon_on_cancel=True,
                                      limiter=trio.CapacityLimiter(1))
    except RuntimeError:  # no worker thread could be started: the trio clock will do
        await trio.sleep(seconds)
    finally:
        stop.set()


def host_killer(spec: dict, ready: dict, token_var: str) -> Callable[[], None]:
    """``HostRun``'s ``kill`` for the host ``ready`` names (``pid``, ``startTime``,
    ``commandPid``): :func:`~dshd.execution.hostlink.abandon`, its pid signalled and its
    descendants walked only while it is the same process (``startTime``)."""

    def kill() -> None:
        pid, start_time = ready.get("pid"), ready.get("startTime")
        st = tree.proc_stat(pid) if isinstance(pid, int) and pid > 0 else None
        same = st is not None and st.start_time == start_time
        abandon(spec, ready if same else {**ready, "pid": -1}, token_var)

    return kill


def outcome_of(record: dict | None, handle: HostHandle | None, argv: list[str], cwd: str,
               spare_wrapper: str | None, text: str) -> ExecOutcome:
    """The outcome of a run whose host left ``record`` (None: it died without one); ``text``
    is the captured output (a sandbox wrapper's resource failure is read from it)."""
    if record is None:
        assert handle is not None
        return ExecOutcome(exit_code=None, error=(
            f"the call host (pid {handle.pid}) died before the command's end was "
            f"recorded: {host_log_tail(handle.dir / 'host.log')}"))
    reason = record.get("reason")
    code = record.get("exitCode")
    code = code if isinstance(code, int) else None
    if reason == "spawn-failed":
        return ExecOutcome(exit_code=None, error=spawn_failed_sentence(argv, cwd, record))
    outcome = ExecOutcome(exit_code=code, timed_out=reason == "timeout",
                          cancelled=reason == "cancelled")
    if reason == "killed":  # the host stopped it on its own (its log could not be written)
        outcome.error = str(record.get("message") or "the call host killed the command")
    else:
        outcome.error = wrapper_resource_failure(spare_wrapper, code, text)
    return outcome


def _await_record(directory: Path, seconds: float) -> dict | None:
    """The exit record on disk, polled for up to ``seconds`` of real time (a worker thread:
    the daemon's own clock, which a test may run virtually, plays no part)."""
    deadline = time.monotonic() + seconds
    while True:
        record = record_on_disk(directory)
        if record is not None or time.monotonic() >= deadline:
            return record
        time.sleep(0.005)


def spawn_failed_sentence(argv: list[str], cwd: str, record: dict) -> str:
    """The sentence of a ``spawn-failed`` exit record: the host's own (it knows the stage:
    chdir, user, exec; worded as :func:`~dshd.execution.spawn.spawn_sentence`), else one
    built from its ``errno``."""
    message = record.get("message")
    if isinstance(message, str) and message:
        return message
    name = str(record.get("errno") or "")
    number = getattr(errno, name, None) if name.isupper() else None
    if not isinstance(number, int):
        return "Could not start the command (the call host gave no reason)."
    return spawn_sentence(argv, cwd, OSError(number, os.strerror(number), argv[0]))


def wrapper_resource_failure(spare_wrapper: str | None, exit_code: int | None,
                             text: str) -> str | None:
    """The sentence for a sandbox wrapper that could not fork the command (bwrap exits 1
    with one line ``bwrap: ...: Resource temporarily unavailable`` at a pids limit), else
    None. Only the call's own output can trigger it, so a command faking it only marks
    its own result as failed."""
    if spare_wrapper is None or exit_code != 1:
        return None
    lines = text.splitlines()
    if len(lines) != 1 or not lines[0].startswith(f"{spare_wrapper}: "):
        return None
    for number in RESOURCE_ERRNOS:
        if lines[0].endswith(os.strerror(number)):
            return (
                f"Could not start the command: could not start a thread/process: resource "
                f"limit ({errno.errorcode[number]}; the sandbox said: {lines[0]}); too many "
                "processes or threads run as this user (RLIMIT_NPROC, a cgroup's pids.max) or "
                "memory is short. Stop some, then run it again."
            )
    return None
