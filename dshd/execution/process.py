"""Run one command in its own process group and capture its output (EXEC.md §2).

Theory of operation
-------------------
:func:`run_command` takes an argv that is ready to exec — a sandbox provider, when there is one,
has already wrapped it — and runs it to a settled :class:`ExecOutcome`:

* **Spawn** (:mod:`dshd.execution.spawn`): ``subprocess.Popen`` *in the trio thread*
  (:func:`~dshd.execution.spawn.spawn` says why: a worker
  thread's exit fires bwrap's ``--die-with-parent``), waited for through a pidfd, with
  ``start_new_session=True`` (the child leads a new session and process group without a
  controlling terminal, so ``killpg(pid)`` reaches everything it forks that does not escape
  with ``setsid``, and no tool can reach a terminal to inject input: bwrap needs no
  ``--new-session``), stdin ``/dev/null``, and stdout *and* stderr dup'ed from the write
  end of one ``os.pipe()``: both streams arrive in write order through one reader. The parent
  closes its copy of the write end right after the spawn, so end of file means "every holder of
  the pipe is gone". The command's script travels in argv or, when long, in a memfd
  (:class:`BashScript`). A spawn failure (missing program, bad cwd, ``EAGAIN`` at a pids or
  thread limit: "resource limit") is an outcome with ``error``.
* **Read** (one task): ``receive_some(READ_CHUNK)`` (1 MiB; the pipe's buffer is raised to
  1 MiB with ``F_SETPIPE_SZ`` where allowed) → ``capture.feed`` → if the capture buffered spill
  bytes, wake the spill writer → ``on_output()``. The **spill writer** (a second task) writes
  everything buffered so far in a worker thread (in the trio thread when no thread can be
  started) while the reader goes on reading; the reader waits for it only once
  ``SPILL_HIGH_WATER`` (4 MiB) is buffered, so a slow disk slows the command down through the
  pipe (back-pressure) instead of growing memory. A spill write error fails the call. Why a
  thread (measured on this project's dev VM, 64 KiB chunks): a synchronous ``os.write`` takes
  15 µs median / 140 µs p99, a ``to_thread`` hop 230 µs median — yet 20 MB of ``yes`` runs at
  the same ~130–170 MB/s either way, because the producer refills the pipe during the hop. The
  thread costs nothing measurable and keeps dirty-page throttling or a slow filesystem off the
  trio thread.
* **Reap** (one task): ``proc.wait()``.
* **Supervise** (the caller's task): wait for the first of exit, ``cancel``, spill failure, or
  the ``timeout`` cancel scope. A process that had already exited when the first event came
  (checked with ``poll()``) counts as an exit: a late cancel or timeout is not reported. Then:

  ======================== ==================================================================
  first event              what happens
  ======================== ==================================================================
  exit                     wait ``eof_grace`` s for end of file (``cancel`` cuts it short);
                           if a background child still holds the pipe, terminate the group
                           (below); outcome = the command's exit code, no flags
  timeout / cancel / spill terminate the group; outcome flags ``timed_out`` / ``cancelled`` /
                           ``error``
  ======================== ==================================================================

  *Terminate* = SIGTERM to the command, wait up to ``kill_grace`` s for exit and end of file,
  then SIGKILL to everything of the call that is left, and wait (bounded) again. "The
  command" (:mod:`dshd.execution.procs` finds and signals it) is the group's members (a ``/proc`` scan) minus the sandbox wrapper's own
  processes: bwrap (``spare_wrapper``) runs as an outer process and, in its pid namespace, an
  inner pid 1; signalling those would tear the sandbox down before the command's ``trap``
  ran, and the command's exit code would never come back. When the command exits, bwrap
  exits with its status. SIGKILL goes to the group (``killpg`` while the leader is unreaped)
  and then to every process of the call's uid whose environment carries this run's token
  (``DSH_RUN=<128 random bits>``, put in the command's environment at the spawn and known to
  nothing else): children that left the group with ``setsid`` (under bwrap the pid namespace
  ends with its pid 1 anyway). The token is chosen per run by the daemon, never by a client:
  a callId is unique only within a session (and clients choose it), so two sessions' calls
  may share one, and a sweep keyed on it killed the other session's call. Each process found
  is opened as a pidfd and its environment read again through ``/proc`` before the signal, so
  a pid reused between the scan and the kill is not hit. If end of file still does not come, a holder of
  the pipe escaped both; the reader is cancelled and the call settles anyway.
* **Outside cancellation** (a session whose stop deadline came; the graceful stop asks
  through ``cancel`` first) or an unexpected error: the ``finally`` clause, shielded under a
  bounded ``move_on_after``, closes the pipe (writers get SIGPIPE), SIGKILLs everything left
  at once as above (no grace: the time is up) and reaps — and only then lets the
  cancellation propagate.

Always, at the end: ``capture.finish()``, a last spill flush, ``capture.spill.close()`` and a
last ``on_output()``. The exit code is the process's, or 128+signal when a signal killed it.
After a normal exit with end of file, processes left in the group that closed the pipe (a
``nohup x >log &``) are left alone under Landlock and ``danger-full-access``; under bwrap the
pid namespace ends with the command (its pid 1 exits), taking them along.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import secrets
import subprocess
from collections.abc import Callable

import msgspec
import trio

from dshd.execution.capture import OutputCapture
from dshd.execution.procs import kill_all, term_command
from dshd.execution.spawn import (
    INLINE_COMMAND_MAX,
    RESOURCE_ERRNOS,
    BashScript,
    Child,
    RunAs,
    bash_argv,
    spawn,
    spawn_sentence,
)

__all__ = ["BashScript", "ExecOutcome", "INLINE_COMMAND_MAX", "READ_CHUNK", "RunAs", "bash_argv",
           "run_command"]

#: Bytes asked of the pipe per read.
READ_CHUNK = 1_048_576
#: Pipe buffer asked for (``F_SETPIPE_SZ``; the kernel default is 64 KiB): a fast producer
#: fills it while the reader works, so one read (one wake-up, one spill hand-off) carries
#: up to 1 MiB instead of 64 KiB. Best effort: over ``pipe-max-size`` or the user's pipe
#: budget the default stays.
PIPE_SIZE = 1_048_576
#: Spill bytes buffered (written by the spill task in a worker thread) before the reader
#: waits: the back-pressure that lets a slow disk slow the command down through the pipe.
SPILL_HIGH_WATER = 4 * 1_048_576
#: Seconds the shielded cleanup may take beyond reaping a SIGKILLed command (closing the
#: pipe, the last spill write).
CLEANUP_SLACK_SECONDS = 5.0
#: Seconds to wait for a SIGKILLed leader to be reaped before giving up on its exit code.
KILL_REAP_TIMEOUT = 10.0
#: The environment variable that carries a run's kill-sweep token (see the module doc).
RUN_TOKEN_VAR = "DSH_RUN"


class ExecOutcome(msgspec.Struct):
    """How a command ended.

    ``exit_code``: the exit status, 128+signal when a signal killed it, None when it never ran
    (spawn failure) or could not be reaped. ``timed_out`` / ``cancelled``: the timeout / the
    cancel event stopped it. ``error``: a sentence for a spawn or spill failure (the call is
    an error whatever the exit code).
    """

    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    error: str | None = None



async def run_command(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    capture: OutputCapture,
    on_output: Callable[[], None],
    timeout: float | None,
    cancel: trio.Event,
    kill_grace: float = 2.0,
    eof_grace: float = 2.0,
    as_user: RunAs | None = None,
    script: BashScript | None = None,
    spare_wrapper: str | None = None,
    pass_fds: "list[int] | None" = None,
) -> ExecOutcome:
    """Run ``argv`` to completion, feeding ``capture``; see the module doc (EXEC.md §2).

    ``as_user``: when the daemon runs as root for another user (system mode), the process is
    started with that user's uid, gid and groups (never root's).
    ``script``: the :class:`BashScript` whose argv is inside ``argv``; its fd (if any) is passed
    to the child, and ``run_command`` closes it in every case.
    ``pass_fds``: more fds the child inherits (the sandbox's pinned workspace and tmpfs lease,
    see :meth:`dshd.execution.sandbox.Provider.confine`); ``run_command`` closes them (and
    empties the list) in every case, as it does the script's.
    ``spare_wrapper``: the process name (``comm``) of the sandbox wrapper when the leader is one
    (``bwrap``): SIGTERM skips the leader and its children of that name (see the module doc).
    The sweep after SIGKILL to the group keys on a token this function makes per run and adds
    to ``env`` as ``DSH_RUN`` (never the client-chosen callId; see the module doc).

    ``argv``: ready to exec (already sandbox-wrapped). ``cwd``/``env``: used as given.
    ``on_output()``: called after every change of ``capture`` (keep it cheap: signal a
    publisher). ``timeout``: seconds, None for none. ``cancel``: set it to stop the command.
    ``kill_grace``: seconds between SIGTERM and SIGKILL. ``eof_grace``: seconds to wait for end
    of file after the command exited.

    Owns the end of ``capture``: calls ``finish()`` and closes ``capture.spill``. Returns an
    :class:`ExecOutcome`; raises ``ValueError`` for a negative or NaN timeout or grace, and
    re-raises an outside cancellation after the process group is killed. An exception from
    ``on_output`` or ``capture`` (a bug) also kills the group first, and comes out wrapped in
    an ``ExceptionGroup`` (trio's strict groups: the reader runs in an internal nursery).
    """
    extra_fds = pass_fds if pass_fds is not None else []
    try:
        _check_arguments(argv, timeout=timeout, kill_grace=kill_grace, eof_grace=eof_grace)
        inherited = (*(script.pass_fds if script is not None else ()), *extra_fds)
        token = secrets.token_hex(16)
        env = {**env, RUN_TOKEN_VAR: token}
        if as_user is not None:
            # Popen enters cwd before it drops root; let the user's own chdir (env -C, after the
            # uid change) decide whether the directory can be entered, so a directory swapped for
            # a symlink after the session was created cannot smuggle root's access in.
            argv = ["env", "-C", cwd, "--", *argv]
            cwd = "/"
        read_fd, write_fd = _open_pipe()
        try:
            proc = spawn(argv, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd,
                         cwd=cwd, env=env, start_new_session=True, pass_fds=inherited,
                         **(as_user.popen_kwargs() if as_user is not None else {}))
        except OSError as exc:
            os.close(read_fd)
            _settle_capture(capture, on_output)
            return ExecOutcome(exit_code=None, error=spawn_sentence(argv, cwd, exc))
        except BaseException:
            os.close(read_fd)
            _settle_capture(capture, on_output)
            raise
        finally:
            os.close(write_fd)
    finally:
        # The child holds its own copies of the script's and the sandbox's fds.
        _release(script, extra_fds)
    run = _Run(proc, trio.lowlevel.FdStream(read_fd), capture, on_output, kill_grace, eof_grace,
               spare_wrapper=spare_wrapper, marker=f"{RUN_TOKEN_VAR}={token}",
               uid=as_user.uid if as_user is not None else os.geteuid())
    return await run.run(timeout, cancel)


def _check_arguments(argv: list[str], **seconds: float | None) -> None:
    """Raise ``ValueError`` for an empty argv or a negative or NaN number of seconds."""
    for name, value in seconds.items():
        if value is not None and not value >= 0:
            raise ValueError(f"{name} must be a non-negative number of seconds, not {value!r}")
    if not argv:
        raise ValueError("run_command needs a non-empty argv")


def _open_pipe() -> tuple[int, int]:
    """The command's output pipe ``(read end, write end)``, its buffer raised to
    :data:`PIPE_SIZE` where the kernel allows it."""
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(read_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass
    return read_fd, write_fd


def _release(script: BashScript | None, extra_fds: list[int]) -> None:
    """Close the script's fd and the extra fds (emptying the list): ``run_command`` owns them."""
    if script is not None:
        script.close()
    while extra_fds:
        os.close(extra_fds.pop())


def _settle_capture(capture: OutputCapture, on_output: Callable[[], None]) -> None:
    capture.finish()
    if capture.spill is not None:
        capture.spill.close()
    on_output()


def _exit_code(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


async def _wait_any(*events: trio.Event) -> None:
    """Return once any of ``events`` is set."""
    if any(event.is_set() for event in events):
        return
    async with trio.open_nursery() as nursery:

        async def wait_one(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        for event in events:
            nursery.start_soon(wait_one, event)


async def _wait_all(*events: trio.Event) -> None:
    for event in events:
        await event.wait()


class _Run:
    """State of one running command: the process, its pipe, and how it ended."""

    def __init__(
        self,
        proc: Child,
        stream: trio.lowlevel.FdStream,
        capture: OutputCapture,
        on_output: Callable[[], None],
        kill_grace: float,
        eof_grace: float,
        *,
        spare_wrapper: str | None,
        marker: str | None,
        uid: int,
    ) -> None:
        self.proc = proc
        self.spare_wrapper = spare_wrapper
        self.marker = marker
        self.uid = uid
        self.stream = stream
        self.capture = capture
        self.on_output = on_output
        self.kill_grace = kill_grace
        self.eof_grace = eof_grace
        self.exited = trio.Event()
        self.eof = trio.Event()
        self.failed = trio.Event()
        self.error: str | None = None
        self.settled = False
        self._spill_ready = trio.Event()
        self._spill_drained = trio.Event()
        self._reading_done = False

    async def run(self, timeout: float | None, cancel: trio.Event) -> ExecOutcome:
        outcome = ExecOutcome(exit_code=None)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read)
                nursery.start_soon(self._reap)
                with trio.move_on_after(math.inf if timeout is None else timeout) as timer:
                    await _wait_any(self.exited, cancel, self.failed)
                if not self.exited.is_set() and self.proc.poll() is not None:
                    self.exited.set()  # it had exited already: a late cancel is no cancellation
                if not self.exited.is_set():
                    if self.failed.is_set():
                        pass
                    elif cancel.is_set():
                        outcome.cancelled = True
                    elif timer.cancelled_caught:
                        outcome.timed_out = True
                    await self._terminate()
                else:
                    with trio.move_on_after(self.eof_grace):
                        await _wait_any(self.eof, self.failed, cancel)
                    if not self.eof.is_set():
                        await self._terminate()
                nursery.cancel_scope.cancel()  # a reader still blocked: a holder outside the group
            self.settled = True
        finally:
            with trio.move_on_after(KILL_REAP_TIMEOUT + CLEANUP_SLACK_SECONDS) as cleanup:
                cleanup.shield = True
                await self._cleanup()
            self.proc.close()
        outcome.exit_code = _exit_code(self.proc.returncode)
        outcome.error = self.error or self._wrapper_resource_failure(outcome.exit_code)
        if outcome.exit_code is None and outcome.error is None:
            outcome.error = (
                f"The command (pid {self.proc.pid}) did not exit after SIGKILL within "
                f"{KILL_REAP_TIMEOUT:g} s; it may be stuck in the kernel. Check it with ps."
            )
        return outcome

    def _wrapper_resource_failure(self, exit_code: int | None) -> str | None:
        """The sentence for a sandbox wrapper that could not fork the command (bwrap exits 1
        with one line ``bwrap: ...: Resource temporarily unavailable`` at a pids limit), else
        None. Only the call's own output can trigger it, so a command faking it only marks
        its own result as failed."""
        if self.spare_wrapper is None or exit_code != 1:
            return None
        text = self.capture.text
        lines = text.splitlines()
        reasons = {os.strerror(e): errno.errorcode[e] for e in RESOURCE_ERRNOS}
        if len(lines) != 1 or not lines[0].startswith(f"{self.spare_wrapper}: "):
            return None
        for reason, name in reasons.items():
            if lines[0].endswith(reason):
                return (
                    f"Could not start the command: could not start a thread/process: resource "
                    f"limit ({name}; the sandbox said: {lines[0]}); too many processes or "
                    "threads run as this user (RLIMIT_NPROC, a cgroup's pids.max) or memory is "
                    "short. Stop some, then run it again."
                )
        return None

    async def _read(self) -> None:
        capture, spill = self.capture, self.capture.spill
        async with trio.open_nursery() as nursery:
            if spill is not None:
                nursery.start_soon(self._spill_writer)
            while True:
                data = await self.stream.receive_some(READ_CHUNK)
                if not data:
                    self._reading_done = True
                    self._spill_ready.set()  # the writer drains what is left, then ends
                    self.eof.set()
                    return
                capture.feed(data)
                if spill is not None and spill.pending:
                    self._spill_ready.set()
                    while spill.pending >= SPILL_HIGH_WATER and not self.failed.is_set():
                        self._spill_drained = trio.Event()
                        await self._spill_drained.wait()
                self.on_output()

    async def _spill_writer(self) -> None:
        """Write the spill in a worker thread while the reader goes on reading (the reader
        hands over chunks; each hand-off writes everything buffered so far)."""
        spill = self.capture.spill
        assert spill is not None
        while True:
            await self._spill_ready.wait()
            self._spill_ready = trio.Event()
            while spill.pending and not self.failed.is_set():
                await self._flush_spill()
            self._spill_drained.set()
            if self._reading_done or self.failed.is_set():
                return

    async def _flush_spill(self) -> None:
        spill = self.capture.spill
        assert spill is not None
        try:
            try:
                await spill.flush()
            except RuntimeError:
                # No worker thread could be started (threads or pids exhausted): the chunks
                # were kept; write them here in the trio thread rather than lose the call.
                spill.flush_sync()
        except OSError as exc:
            if self.error is None:
                self.error = (
                    f"Could not write the output spill file {spill.path} "
                    f"({exc.strerror or exc}); the command was stopped so that no output is "
                    "lost silently. Free disk space or fix the session directory, then run it "
                    "again."
                )
            self.failed.set()

    async def _reap(self) -> None:
        await self.proc.wait()
        self.exited.set()

    def _term_command(self) -> None:
        """SIGTERM to the command (not to the sandbox wrapper's own processes)."""
        term_command(self.proc.pid, self.spare_wrapper)

    def _kill_all(self) -> None:
        """SIGKILL to the group, then to the run's processes that left it."""
        kill_all(self.proc.pid, leader_reaped=self.proc.returncode is not None,
                 marker=self.marker, uid=self.uid)

    async def _terminate(self) -> None:
        """SIGTERM the command; after ``kill_grace`` s without exit and EOF, SIGKILL it all.
        Whatever is left of the call afterwards (background processes that ignored TERM and
        closed the pipe, ``setsid`` children) is SIGKILLed too."""
        self._term_command()
        with trio.move_on_after(self.kill_grace):
            await _wait_all(self.exited, self.eof)
        self._kill_all()
        if self.exited.is_set() and self.eof.is_set():
            return
        with trio.move_on_after(KILL_REAP_TIMEOUT):
            await self.exited.wait()
        with trio.move_on_after(self.kill_grace):
            await self.eof.wait()

    async def _cleanup(self) -> None:
        """Runs shielded: kill what is left after an abnormal exit, then settle the capture.

        An abnormal exit is a cancellation from outside (a session whose stop deadline came,
        a crash) or an error of the run itself: there is no time for a grace, so everything
        left is SIGKILLed at once (the graceful TERM, ``kill_grace``, KILL is ``_terminate``'s,
        for a cancel the call asked for)."""
        await self.stream.aclose()
        if not self.settled:
            self._kill_all()
            if self.proc.returncode is None:
                with trio.move_on_after(KILL_REAP_TIMEOUT):
                    await self.proc.wait()
        capture, spill = self.capture, self.capture.spill
        capture.finish()
        if spill is not None:
            if spill.pending:
                await self._flush_spill()
            spill.close()
        self.on_output()
