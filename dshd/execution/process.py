"""Run one command in its own process group and capture its output (EXEC.md §2).

Theory of operation
-------------------
:func:`run_command` takes an argv that is ready to exec — a sandbox provider, when there is one,
has already wrapped it — and runs it to a settled :class:`ExecOutcome`:

* **Spawn**: ``trio.lowlevel.open_process`` with ``start_new_session=True`` (the child leads a
  new session and process group, so ``killpg(pid)`` reaches everything it forks that does not
  escape with ``setsid``), stdin ``/dev/null``, and stdout *and* stderr dup'ed from the write
  end of one ``os.pipe()``: both streams arrive in write order through one reader. The parent
  closes its copy of the write end right after the spawn, so end of file means "every holder of
  the pipe is gone". A spawn failure (missing program, bad cwd) is an outcome with ``error``.
* **Read** (one task): ``receive_some(64 KiB)`` → ``capture.feed`` → flush the spill sink in a
  worker thread if the capture buffered anything → ``on_output()``. The flush is awaited before
  the next read, so a slow disk slows the command down through the pipe (back-pressure) instead
  of growing memory. A spill write error fails the call. Why a thread (measured on this
  project's dev VM, 64 KiB chunks): a synchronous ``os.write`` takes 15 µs median / 140 µs p99,
  a ``to_thread`` hop 230 µs median — yet 20 MB of ``yes`` runs at the same ~130–170 MB/s
  either way, because the producer refills the pipe during the hop. The thread costs nothing
  measurable and keeps dirty-page throttling or a slow filesystem off the trio thread.
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

  *Terminate* = SIGTERM to the group, wait up to ``kill_grace`` s for exit and end of file,
  then SIGKILL to the group and wait (bounded) again. If end of file still does not come, a
  process outside the group (``setsid``) holds the pipe; the reader is cancelled and the call
  settles anyway.
* **Outside cancellation** (daemon shutdown) or an unexpected error: the ``finally`` clause,
  shielded under a bounded ``move_on_after``, closes the pipe (writers get SIGPIPE), sends
  SIGTERM, waits up to ``kill_grace`` s for the leader, then SIGKILLs the group and reaps —
  and only then lets the cancellation propagate.

Always, at the end: ``capture.finish()``, a last spill flush, ``capture.spill.close()`` and a
last ``on_output()``. The exit code is the process's, or 128+signal when a signal killed it.
After a normal exit with end of file, processes left in the group that closed the pipe (a
``nohup x >log &``) are left alone; under bwrap ``--die-with-parent`` takes care of them.
"""

from __future__ import annotations

import fcntl
import math
import os
import shutil
import signal
import subprocess
from collections.abc import Callable

import msgspec
import trio

from dshd.execution.capture import OutputCapture

__all__ = ["ExecOutcome", "bash_argv", "run_command", "READ_CHUNK"]

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
#: Seconds to wait for a SIGKILLed leader to be reaped before giving up on its exit code.
KILL_REAP_TIMEOUT = 10.0


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


def bash_argv(command: str) -> list[str]:
    """``[<bash>, "-c", "--", command]``; ``/bin/sh`` when there is no bash on ``$PATH``.

    The shell is resolved to an absolute path with the daemon's ``PATH`` (the session's ``env``
    may not have one that finds it). ``--`` keeps a command starting with ``-`` or ``+`` from
    being read as shell options.
    """
    shell = shutil.which("bash") or "/bin/sh"
    return [shell, "-c", "--", command]


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
    as_user: "RunAs | None" = None,
) -> ExecOutcome:
    """Run ``argv`` to completion, feeding ``capture``; see the module doc (EXEC.md §2).

    ``as_user``: when the daemon runs as root for another user (system mode), the process is
    started with that user's uid, gid and groups (never root's).

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
    for name, value in (("timeout", timeout), ("kill_grace", kill_grace), ("eof_grace", eof_grace)):
        if value is not None and not value >= 0:
            raise ValueError(f"{name} must be a non-negative number of seconds, not {value!r}")
    if not argv:
        raise ValueError("run_command needs a non-empty argv")
    if as_user is not None:
        # Popen enters cwd before it drops root; let the user's own chdir (env -C, after the
        # uid change) decide whether the directory can be entered, so a directory swapped for
        # a symlink after the session was created cannot smuggle root's access in.
        argv = ["env", "-C", cwd, "--", *argv]
        cwd = "/"
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(read_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass
    try:
        proc = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            cwd=cwd,
            env=env,
            start_new_session=True,
            **(as_user.popen_kwargs() if as_user is not None else {}),
        )
    except OSError as exc:
        os.close(read_fd)
        _settle_capture(capture, on_output)
        return ExecOutcome(exit_code=None, error=_spawn_sentence(argv, cwd, exc))
    except BaseException:
        os.close(read_fd)
        _settle_capture(capture, on_output)
        raise
    finally:
        os.close(write_fd)
    run = _Run(proc, trio.lowlevel.FdStream(read_fd), capture, on_output, kill_grace, eof_grace)
    return await run.run(timeout, cancel)


class RunAs(msgspec.Struct, frozen=True):
    """The identity a tool runs under when it is not the daemon's own: uid, gid, groups."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    def popen_kwargs(self) -> dict:
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}


def _settle_capture(capture: OutputCapture, on_output: Callable[[], None]) -> None:
    capture.finish()
    if capture.spill is not None:
        capture.spill.close()
    on_output()


def _spawn_sentence(argv: list[str], cwd: str, exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    if exc.filename is not None and os.fspath(exc.filename) == cwd:
        return (
            f"Could not start the command: the working directory {cwd} is not usable ({reason}). "
            "Check that it exists and is a directory you can enter."
        )
    return (
        f"Could not start the command: {argv[0]}: {reason}. "
        "Check that the program exists and is executable."
    )


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
        proc: trio.Process,
        stream: trio.lowlevel.FdStream,
        capture: OutputCapture,
        on_output: Callable[[], None],
        kill_grace: float,
        eof_grace: float,
    ) -> None:
        self.proc = proc
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
            with trio.move_on_after(self.kill_grace + KILL_REAP_TIMEOUT + 5.0) as cleanup:
                cleanup.shield = True
                await self._cleanup()
        outcome.exit_code = _exit_code(self.proc.returncode)
        outcome.error = self.error
        if outcome.exit_code is None and outcome.error is None:
            outcome.error = (
                f"The command (pid {self.proc.pid}) did not exit after SIGKILL within "
                f"{KILL_REAP_TIMEOUT:g} s; it may be stuck in the kernel. Check it with ps."
            )
        return outcome

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
            await spill.flush()
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

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is empty (or holds only processes we may not signal)

    async def _terminate(self) -> None:
        """SIGTERM the group; after ``kill_grace`` s without exit and EOF, SIGKILL it."""
        self._signal_group(signal.SIGTERM)
        with trio.move_on_after(self.kill_grace):
            await _wait_all(self.exited, self.eof)
        if self.exited.is_set() and self.eof.is_set():
            return
        self._signal_group(signal.SIGKILL)
        with trio.move_on_after(KILL_REAP_TIMEOUT):
            await self.exited.wait()
        with trio.move_on_after(self.kill_grace):
            await self.eof.wait()

    async def _cleanup(self) -> None:
        """Runs shielded: kill what is left after an abnormal exit, then settle the capture."""
        await self.stream.aclose()
        if not self.settled:
            if self.proc.returncode is None:
                self._signal_group(signal.SIGTERM)
                with trio.move_on_after(self.kill_grace):
                    await self.proc.wait()
            self._signal_group(signal.SIGKILL)
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
