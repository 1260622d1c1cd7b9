"""Starting the command: fork + exec in the single-threaded host (HOST.md §2, §5).

Theory of operation: :func:`spawn` prepares the command's descriptors, forks, and in the child
runs only what must happen between fork and exec, in this order:

1. every signal disposition back to the default (SIGPIPE included: Python ignores it, and an
   ignored signal stays ignored across exec; SIGHUP/SIGINT, which the host ignores, too), the
   wakeup fd unset, the signal mask emptied;
2. terminal mode: ``os.login_tty(slave)`` (a new session, the PTY slave as its controlling
   terminal, and as fds 0/1/2); the window size was set on the slave before the fork and
   ``TERM`` is in the environment. Pipe mode: ``setsid`` (a new session and process group
   without a terminal), stdin ``/dev/null`` or the read end of the stdin pipe, stdout and
   stderr both the write end of one output pipe (one reader sees both streams in write order);
3. every other fd closed except the spec's ``pass_fds`` (made inheritable);
4. the drop to ``user`` (``setgroups``, ``setresgid``, ``setresuid``), then ``chdir(cwd)`` as
   that user, so root's access never decides whether the directory can be entered;
5. ``execvpe`` (``PATH`` of the command's own environment for a bare name).

A failure in the child is written as ``<stage> <errno>`` to a CLOEXEC pipe whose read end the
host reads to EOF right after the fork: EOF with nothing means the exec happened. The host
turns a failure (or a failed ``fork``) into :class:`SpawnFailure` with a sentence a person can
act on, naming the program or the directory (:func:`failure_sentence`); ``EAGAIN``/``ENOMEM``
name the resource limit.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import struct
import termios

__all__ = ["Spawned", "SpawnFailure", "failure_sentence", "set_winsize", "spawn"]

#: Errors of fork/clone/exec that mean "a resource limit was hit" (pids, threads, memory).
RESOURCE_ERRNOS = (errno.EAGAIN, errno.ENOMEM)
#: Bytes asked for the output pipe's buffer (best effort, ``F_SETPIPE_SZ``).
PIPE_SIZE = 1_048_576


class SpawnFailure(Exception):
    """The command could not be started: ``errno_name`` and a sentence (``message``)."""

    def __init__(self, errno_name: str, message: str) -> None:
        super().__init__(message)
        self.errno_name = errno_name
        self.message = message


class Spawned:
    """The started command: its pid, the output fd to read, the stdin fd to write (or None)."""

    __slots__ = ("output_fd", "pid", "stdin_fd")

    def __init__(self, pid: int, output_fd: int, stdin_fd: int | None) -> None:
        self.pid, self.output_fd, self.stdin_fd = pid, output_fd, stdin_fd


def set_winsize(fd: int, cols: int, rows: int) -> None:
    """TIOCSWINSZ on a PTY fd (the kernel sends SIGWINCH to the foreground group)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def failure_sentence(stage: str, code: int, program: str, cwd: str) -> str:
    """The sentence for a failed spawn at ``stage`` with errno ``code``."""
    reason = os.strerror(code)
    name = errno.errorcode.get(code, str(code))
    if code in RESOURCE_ERRNOS:
        return (f"Could not start the command: could not start a process: resource limit "
                f"({name}: {reason}); too many processes or threads run as this user "
                "(RLIMIT_NPROC, a cgroup's pids.max) or memory is short. Stop some, then run "
                "it again.")
    if stage == "chdir":
        return (f"Could not start the command: the working directory {cwd} is not usable "
                f"({reason}). Check that it exists and is a directory you can enter.")
    if stage == "user":
        return (f"Could not start the command: could not switch to the session's user "
                f"({reason}).")
    if stage == "exec":
        return (f"Could not start the command: {program}: {reason}. Check that the program "
                "exists and is executable.")
    return f"Could not start the command: {stage} failed ({reason})."


def _open_output(tty: dict | None, stdin_pipe: bool):
    """``(parent_fds, child_fds)``: parent = (output, stdin or None); child = (slave) or
    (stdin_read or None, output_write)."""
    if tty is not None:
        master, slave = os.openpty()
        set_winsize(slave, tty["cols"], tty["rows"])
        os.set_blocking(master, False)
        return (master, master), ("tty", slave)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # over pipe-max-size or the user's pipe budget: the default stays
    os.set_blocking(read_end, False)
    stdin_read = stdin_write = None
    if stdin_pipe:
        stdin_read, stdin_write = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(stdin_write, False)
    return (read_end, stdin_write), ("pipe", stdin_read, write_end)


def spawn(spec: dict) -> Spawned:
    """Fork and exec the spec's command (see the module doc); raises :class:`SpawnFailure`."""
    env = dict(spec["env"])
    if spec["tty"] is not None:
        env["TERM"] = spec["tty"]["term"]
    env[spec["token_var"]] = spec["token"]
    (output_fd, stdin_fd), child_fds = _open_output(spec["tty"], spec["stdin"] == "pipe")
    err_read, err_write = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (err_read, err_write, output_fd, stdin_fd, *child_fds[1:]):
            if fd is not None:
                _close_quietly(fd)
        code = exc.errno or errno.EAGAIN
        raise SpawnFailure(errno.errorcode.get(code, str(code)),
                           failure_sentence("fork", code, spec["argv"][0], spec["cwd"])) from None
    if pid == 0:
        _child(spec, env, child_fds, err_write)  # never returns
    os.close(err_write)
    for fd in child_fds[1:]:
        if fd is not None:
            os.close(fd)
    report = _read_all(err_read)
    os.close(err_read)
    if report:
        os.waitpid(pid, 0)
        for fd in {output_fd, stdin_fd} - {None}:
            _close_quietly(fd)
        stage, _, number = report.decode("ascii", "replace").partition(" ")
        code = int(number) if number.isdigit() else errno.EINVAL
        raise SpawnFailure(errno.errorcode.get(code, str(code)),
                           failure_sentence(stage, code, spec["argv"][0], spec["cwd"]))
    return Spawned(pid, output_fd, stdin_fd)


def _read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 256)
        except InterruptedError:
            continue
        if not chunk:
            return out
        out += chunk


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _reset_signals() -> None:
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # not settable (a real-time signal the libc reserves)
    _reset_libc_reserved()
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


#: Signals glibc reserves for itself (NPTL's SIGCANCEL, SIGSETXID): its sigaction refuses them,
#: so an ignored one inherited by the host would reach the command ignored too.
_LIBC_RESERVED = (32, 33)
_SYS_RT_SIGACTION = {"x86_64": 13, "aarch64": 134}


def _reset_libc_reserved() -> None:
    """SIG_DFL for the libc-reserved signals through the raw ``rt_sigaction`` system call
    (best effort; only in the forked child, which is single-threaded)."""
    number = _SYS_RT_SIGACTION.get(os.uname().machine)
    if number is None:
        return
    import ctypes  # here only: the child is about to exec

    libc = ctypes.CDLL(None, use_errno=True)
    act = ctypes.create_string_buffer(32)  # handler 0 (SIG_DFL), flags 0, restorer 0, mask 0
    for sig in _LIBC_RESERVED:
        libc.syscall(number, sig, act, None, 8)


def _spare_wrapper_the_keyboard() -> None:
    """Under a PTY the sandbox wrapper (bwrap's outer process and its pid 1) is in the
    terminal's foreground process group, so the keyboard's SIGINT, SIGQUIT and SIGTSTP would
    reach it and tear the sandbox down before the command's ``trap`` ran. The wrapper starts
    with them ignored; the daemon's argv gives the command their defaults back inside the
    sandbox (``env --default-signal``), HOST.md §5."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP):
        signal.signal(sig, signal.SIG_IGN)


def _child(spec: dict, env: dict, child_fds: tuple, err_write: int) -> None:
    """In the forked child: set up and exec; on failure report ``<stage> <errno>`` and exit."""
    stage = "setup"
    try:
        _reset_signals()
        if child_fds[0] == "tty":
            os.login_tty(child_fds[1])
            if spec["spare_wrapper"] is not None:
                _spare_wrapper_the_keyboard()
        else:
            _, stdin_read, write_end = child_fds
            os.setsid()
            if stdin_read is None:
                stdin_read = os.open(os.devnull, os.O_RDONLY)
            os.dup2(stdin_read, 0)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
        keep = sorted({0, 1, 2, err_write, *spec["pass_fds"]})
        low = 3
        for fd in keep:
            if fd >= low:
                os.closerange(low, fd)
                low = fd + 1
        os.closerange(low, 1 << 20)
        for fd in spec["pass_fds"]:
            os.set_inheritable(fd, True)
        user = spec["user"]
        if user is not None:
            stage = "user"
            os.setgroups(user["groups"])
            os.setresgid(user["gid"], user["gid"], user["gid"])
            os.setresuid(user["uid"], user["uid"], user["uid"])
        stage = "chdir"
        os.chdir(spec["cwd"])
        stage = "exec"
        os.execvpe(spec["argv"][0], spec["argv"], env)
    except BaseException as exc:  # noqa: BLE001 -- the child must never return into the host
        code = getattr(exc, "errno", None) or errno.EINVAL
        try:
            os.write(err_write, f"{stage} {code}".encode())
        finally:
            os._exit(127)
    os._exit(127)
