"""Starting a command's process: its argv, its identity, the spawn, the child (EXEC.md §2).

Theory of operation: a tool call's bash command reaches the shell as argv or, when it is too
long for argv, as a sealed memfd (:class:`BashScript`); a daemon that runs as root for another
user starts it as that user (:class:`RunAs`). :func:`spawn` runs ``subprocess.Popen`` in the
calling (trio) thread -- its docstring says why never in a worker thread -- and returns a
:class:`Child` that is awaited through a pidfd; :mod:`dshd.execution.hosted` uses it to start
a call host (the command itself is the host's child). :func:`spawn_sentence` turns a failed
spawn into the sentence the call's result carries.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess

import msgspec
import trio

__all__ = ["BashScript", "Child", "INLINE_COMMAND_MAX", "RESOURCE_ERRNOS", "RunAs", "bash_argv",
           "spawn", "spawn_sentence"]

#: Longest command (UTF-8 bytes) passed as ``bash -c``; longer ones go through a memfd
#: (:class:`BashScript`). Well under ``MAX_ARG_STRLEN`` (128 KiB), leaving room for the rest.
INLINE_COMMAND_MAX = 64 * 1024
#: Errors of fork/clone that mean "a resource limit was hit" (pids, threads, memory).
RESOURCE_ERRNOS = (errno.EAGAIN, errno.ENOMEM)


def bash_argv(command: str) -> list[str]:
    """``[<bash>, "-c", "--", command]``; ``/bin/sh`` when there is no bash on ``$PATH``.

    The shell is resolved to an absolute path with the daemon's ``PATH`` (the session's ``env``
    may not have one that finds it). ``--`` keeps a command starting with ``-`` or ``+`` from
    being read as shell options. Only for commands that fit in one argv string; a tool call
    uses :class:`BashScript`, which passes a command of any size.
    """
    return [_shell(), "-c", "--", command]


def _shell() -> str:
    return shutil.which("bash") or "/bin/sh"


class BashScript:
    """How a bash command reaches the shell, whatever its size (EXEC.md §2).

    Up to :data:`INLINE_COMMAND_MAX` bytes (UTF-8) it is ``bash -c -- <command>`` (so ``$0`` is
    the shell and bash execs a lone last command, as ever). A longer one would not fit in argv
    (the kernel's ``MAX_ARG_STRLEN``, 128 KiB per string: a 1 MiB heredoc failed with E2BIG),
    so it is written to a sealed memfd (``memfd_create``, read-only from then on) that the child
    inherits, and run as ``bash -- /dev/fd/<n>``: no file on disk, no bind into a sandbox,
    readable by a tool running as another uid (a memfd's inode is mode 0777; the seals make it
    immutable), and the ``/dev/fd`` of a bwrap sandbox's own ``/dev`` finds it. The script's
    fd stays open (read-only, immutable) in the command's processes.

    Owns the fd: :meth:`close` (``run_hosted`` calls it) is idempotent; a forgotten one is
    closed when the object is collected.
    """

    def __init__(self, command: str) -> None:
        data = command.encode("utf-8", "surrogateescape")
        self.fd: int | None = None
        if len(data) <= INLINE_COMMAND_MAX:
            self.argv = [_shell(), "-c", "--", command]
            return
        fd = os.memfd_create("dsh-command", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                        | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.argv = [_shell(), "--", f"/dev/fd/{fd}"]

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return () if self.fd is None else (self.fd,)

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def __del__(self) -> None:
        self.close()




def spawn(argv: list[str], **popen_kwargs) -> Child:
    """``subprocess.Popen`` in the calling (trio) thread — never in a worker thread.

    Why: bwrap's ``--die-with-parent`` is ``PR_SET_PDEATHSIG``, which fires when the *thread*
    that forked the child exits, and trio's worker threads exit after 10 s idle: a call spawned
    from one was SIGKILLed ~10 s later (issue 10 item 1). The trio thread lives as long as the
    daemon, which is the lifetime ``--die-with-parent`` means. Needing no thread also lets a
    spawn under thread exhaustion fail with the kernel's reason (``EAGAIN`` from fork) rather
    than "can't start new thread". The cost: the event loop waits for fork + exec (``vfork``
    where CPython can use it), a few milliseconds.
    """
    return Child(subprocess.Popen(argv, **popen_kwargs))


class Child:
    """A spawned process, awaited through a pidfd (as trio does), else by polling."""

    POLL_INTERVAL = 0.05

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.pid = popen.pid
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except OSError:
            self._pidfd = None  # no pidfd (old kernel, no fds left): poll instead

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    async def wait(self) -> int:
        try:
            while self.popen.poll() is None:
                if self._pidfd is not None:
                    await trio.lowlevel.wait_readable(self._pidfd)
                else:
                    await trio.sleep(self.POLL_INTERVAL)
        finally:
            if self.popen.returncode is not None:
                self._close_pidfd()
        return self.popen.returncode

    def close(self) -> None:
        """Give up waiting (the pidfd is closed; a process never reaped stays with Popen)."""
        self._close_pidfd()

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            fd, self._pidfd = self._pidfd, None
            trio.lowlevel.notify_closing(fd)
            os.close(fd)


class RunAs(msgspec.Struct, frozen=True):
    """The identity a tool runs under when it is not the daemon's own: uid, gid, groups."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    def popen_kwargs(self) -> dict:
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}



def spawn_sentence(argv: list[str], cwd: str, exc: OSError) -> str:
    """The sentence a person acts on for a failed spawn: a resource limit (``EAGAIN`` /
    ``ENOMEM`` from fork), an unusable working directory, or a missing program."""
    reason = exc.strerror or str(exc)
    if exc.errno in RESOURCE_ERRNOS:
        return (
            f"Could not start the command: could not start a thread/process: resource limit "
            f"({errno.errorcode[exc.errno]}: {reason}); too many processes or threads run as "
            "this user (RLIMIT_NPROC, a cgroup's pids.max) or memory is short. Stop some, "
            "then run it again."
        )
    if exc.filename is not None and os.fspath(exc.filename) == cwd:
        return (
            f"Could not start the command: the working directory {cwd} is not usable ({reason}). "
            "Check that it exists and is a directory you can enter."
        )
    return (
        f"Could not start the command: {argv[0]}: {reason}. "
        "Check that the program exists and is executable."
    )

