"""The daemon's side of a call host: start it, talk to it, run the call to an outcome (HOST.md).

Theory of operation
-------------------
A tool call's command is owned by a *call host* (:mod:`dshd.callhost`, stdlib only): one
process per call, started detached, the command's subreaper, owner of its PTY or pipes, its
stdin and its raw output log ``<call dir>/output.raw`` (segments), which writes ``exit.json``
durably when the command ends. This module is everything the daemon does with one:

* **Start** (:func:`start_host`): ``[sys.executable, "-I", "-S", <dshd/callhost/main.py>]``
  (exec'd through ``/proc/self/exe``: the daemon's own binary, whatever its path) is
  ``Popen``'d *in the trio thread* (a worker thread's exit would fire a ``PR_SET_PDEATHSIG``
  set up in it) with stdin and stdout on pipes, stderr on the call's ``host.log``,
  ``close_fds``, ``pass_fds`` = the script's memfd and the sandbox's fds, its own session,
  cwd ``/``. The daemon writes ONE JSON spec (HOST.md §2) and closes stdin; the host double-forks
  (the intermediate exits at once and is reaped here, so the host proper is the child of the nearest subreaper (pid 1 on most systems) and
  holds no daemon descriptor) and writes ONE ready line ``{"ok": true, "pid", "startTime",
  "control", "commandPid"}`` (or ``{"ok": false, "error"}``: :class:`HostStartError`).
* **Control** (:class:`HostHandle`): the Unix stream socket ``control.sock`` in the call directory (masked in every sandbox), JSON lines. The first line
  carries the spec's random secret (the host also checks ``SO_PEERCRED``); then ``attach``
  starts the host's pushed ``progress`` events (``endOffset``, ``firstOffset``, ``totalLines``)
  and the one ``exit`` event (the exit record, once durable). Requests carry an ``id``; one
  pump task reads every line and hands replies to their waiters. ``write``, ``close-stdin``,
  ``resize`` and ``signal`` are what the raw room's methods use (``Call.host``); an error reply
  is :class:`HostRequestError` (``code``, ``sentence``). A connection that ends makes every
  waiting request fail with ``not-running``.
* **Run** (:func:`run_hosted`): progress → the call's :class:`~dshd.execution.capture.
  OutputCapture` reads what is new from the log (:func:`~dshd.execution.capture.catch_up`:
  the file read in a worker thread, the window work in the trio thread; while output flows at
  most one read per :data:`READ_INTERVAL`, or per :data:`TURNOVER_INTERVAL` after a read that
  turned the window over, so the daemon's CPU grows with publishes, not with bytes) → ``on_output()``. The ``cancel`` event → ``terminate {grace: kill_grace, reason:
  "cancelled"}`` (the host sends TERM to the command, KILL to the whole tree after the grace).
  The timeout is the host's (spec ``timeout``: reason ``timeout``). A cancellation from
  outside (the session's stop deadline) or an error of the run → ``terminate {grace: 0,
  reason: "killed"}``, shielded and bounded, before it propagates. The exit record →
  :class:`ExecOutcome`; then ``release`` (the host exits once the record is durable). A host
  whose connection ends with no exit record (and no ``exit.json``) died: an error outcome.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import trio


from dshd.execution.capture import OutputCapture, catch_up
from dshd.execution.hostlink import (
    MAX_LINE, HostHandle, HostRequestError, abandon, host_log_tail, log_reader, read_line,
    record_on_disk, start_sentence,
    scan_log,
)
from dshd.execution.spawn import RESOURCE_ERRNOS, BashScript, RunAs, spawn, spawn_sentence

__all__ = ["ExecOutcome", "HostHandle", "HostRequestError", "HostStartError", "HOST_MAIN",
           "RUN_TOKEN_VAR", "run_hosted", "start_host"]

#: The host program, started by absolute path with ``python3 -I -S`` (HOST.md §2).
HOST_MAIN = Path(__file__).resolve().parent.parent / "callhost" / "main.py"
#: The interpreter the host runs on: the daemon's own binary, by its magic link. Its path
#: (``sys.executable``, a venv's symlink chain) may pass through a directory the daemon's
#: user cannot search — a Python installed under /root for a daemon that runs as another
#: user — which the exec of a magic link never walks.
HOST_INTERPRETER = "/proc/self/exe"
#: The environment variable that carries a run's kill-sweep token (the host's sweep keys on it).
RUN_TOKEN_VAR = "DSH_RUN"
#: Seconds a host may take to answer its spec with the ready line.
START_TIMEOUT = 30.0
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
#: record, a last read, release).
CLEANUP_SECONDS = 10.0


class ExecOutcome(msgspec.Struct):
    """How a command ended.

    ``exit_code``: the exit status, 128+signal when a signal killed it, None when it never ran
    (spawn failure) or its host died. ``timed_out`` / ``cancelled``: the timeout / the cancel
    event stopped it. ``error``: a sentence for a spawn failure or a host failure (the call is
    an error whatever the exit code).
    """

    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    error: str | None = None


class HostStartError(Exception):
    """The host could not be started or refused its spec; ``str()`` is the sentence."""



# ----------------------------------------------------------------------------- starting
def host_spec(argv: list[str], *, call_dir: Path, cwd: str, env: dict[str, str],
              as_user: RunAs | None, tty: tuple[int, int, str] | None, stdin: str,
              pass_fds: list[int], spare_wrapper: str | None, token: str, secret: str,
              spill_max_bytes: int, timeout: float | None, kill_grace: float,
              eof_grace: float, linger: float) -> dict:
    """The host's spec (HOST.md §2, version 1)."""
    return {
        "version": 1, "dir": str(call_dir), "argv": argv, "cwd": cwd, "env": env,
        "user": (None if as_user is None else
                 {"uid": as_user.uid, "gid": as_user.gid, "groups": list(as_user.groups)}),
        "tty": None if tty is None else {"cols": tty[0], "rows": tty[1], "term": tty[2]},
        "stdin": "pipe" if tty is not None else stdin, "pass_fds": list(pass_fds),
        "spare_wrapper": spare_wrapper, "token_var": RUN_TOKEN_VAR, "token": token,
        "spill_max_bytes": spill_max_bytes, "segment_bytes": max(spill_max_bytes // 4, 4096),
        "timeout": timeout, "kill_grace": kill_grace, "eof_grace": eof_grace,
        "linger": linger, "secret": secret,
    }


async def start_host(spec: dict, pass_fds: list[int]) -> HostHandle:
    """Start a host for ``spec`` and return its attached handle (module doc).

    Raises :class:`HostStartError` with a sentence when the host could not be started, refused
    the spec, or could not be reached."""
    call_dir = Path(spec["dir"])
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    log_fd = None
    try:
        try:
            log_fd = os.open(call_dir / "host.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND
                             | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:  # a full disk, no descriptors left
            raise HostStartError(f"could not create {call_dir / 'host.log'} for the call "
                                 f"host: {exc.strerror or exc}") from None
        try:
            child = spawn([sys.executable, "-I", "-S", str(HOST_MAIN)], stdin=in_r, stdout=out_w,
                          stderr=log_fd, close_fds=True, pass_fds=tuple(pass_fds),
                          start_new_session=True, cwd="/", executable=HOST_INTERPRETER)
        except OSError as exc:
            raise HostStartError(start_sentence(exc)) from None
    except BaseException:
        for fd in (in_w, out_r):
            os.close(fd)
        raise
    finally:
        for fd in (in_r, out_w, log_fd):
            if fd is not None:
                os.close(fd)
    spec_in = trio.lowlevel.FdStream(in_w)
    ready_out = trio.lowlevel.FdStream(out_r)
    try:
        with trio.move_on_after(START_TIMEOUT) as timer:
            try:
                await spec_in.send_all(json.dumps(spec).encode())
            except (trio.BrokenResourceError, OSError):
                pass  # the host went away: its ready line (or none) says why
            await spec_in.aclose()
            ready = await _ready_line(ready_out)
            await child.wait()  # the intermediate exits at once after the double fork
        if timer.cancelled_caught:
            # It may yet start the command: sweep the run's token so nothing runs unowned.
            abandon(spec, {}, RUN_TOKEN_VAR)
            raise HostStartError(f"the call host did not report ready within "
                                 f"{START_TIMEOUT:g} s; see {call_dir / 'host.log'}")
    finally:
        await spec_in.aclose()
        await ready_out.aclose()
        child.close()
    if ready is None or not ready.get("ok"):
        reason = (ready or {}).get("error") or host_log_tail(call_dir / "host.log")
        for number in RESOURCE_ERRNOS:  # the host's own fork or thread hit the limit
            if os.strerror(number) in reason or errno.errorcode[number] in reason:
                raise HostStartError(start_sentence(OSError(number, os.strerror(number))))
        raise HostStartError(f"the call host could not start the call: {reason}")
    try:
        return await connect(ready, spec)
    except HostStartError:
        abandon(spec, ready, RUN_TOKEN_VAR)  # it runs the command: a result saying "failed" must be true
        raise


async def connect(ready: dict, spec: dict) -> HostHandle:
    """Connect to the host's control socket, say hello with the secret, and ``attach``."""
    pid = int(ready.get("pid", 0))
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    try:
        # The socket file is in the call directory (HOST.md §4), addressed through its
        # descriptor: the directory's path may be longer than a socket address allows.
        dirfd = os.open(spec["dir"], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            await sock.connect(f"/proc/self/fd/{dirfd}/{ready['control']}")
        finally:
            os.close(dirfd)
    except (OSError, KeyError) as exc:
        sock.close()
        raise HostStartError(f"could not reach the call host (pid {pid}): {exc}") from None
    stream = trio.SocketStream(sock)
    handle = HostHandle(Path(spec["dir"]), stream, pid=pid, tty=spec["tty"] is not None,
                        stdin_pipe=spec["stdin"] == "pipe", segment_bytes=spec["segment_bytes"])
    try:
        await stream.send_all(json.dumps({"hello": 1, "secret": spec["secret"]}).encode() + b"\n")
        with trio.move_on_after(START_TIMEOUT):
            hello = await read_line(handle)
        if not hello or hello.get("hello") != 1:
            raise HostStartError(f"the call host (pid {pid}) did not answer its hello")
    except BaseException:
        await stream.aclose()
        raise
    return handle


async def _ready_line(stream: trio.lowlevel.FdStream) -> dict | None:
    buffer = bytearray()
    while b"\n" not in buffer and len(buffer) < MAX_LINE:
        data = await stream.receive_some(65536)
        if not data:
            break
        buffer += data
    line = bytes(buffer).partition(b"\n")[0]
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# ----------------------------------------------------------------------------- running
async def run_hosted(
    argv: list[str],
    *,
    call_dir: Path,
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
    pass_fds: list[int] | None = None,
    tty: tuple[int, int, str] | None = None,
    stdin: str = "null",
    spill_max_bytes: int = 1 << 30,
    linger: float = 300.0,
    on_host: Callable[[HostHandle], None] | None = None,
) -> ExecOutcome:
    """Run ``argv`` under a new call host in ``call_dir`` (which must exist, 0700) to an
    :class:`ExecOutcome`, feeding ``capture`` from the host's log; see the module doc.

    ``script`` and ``pass_fds`` are closed (the list emptied) in every case. ``tty``: ``(cols,
    rows, TERM)`` for a PTY, None for pipes; ``stdin``: ``"null"`` or ``"pipe"``. ``on_host``:
    called with the handle once the host runs (``Call.host``). Raises ``ValueError`` for an
    empty argv or a negative or NaN timeout or grace; re-raises an outside cancellation after
    the host was told to kill everything (bounded)."""
    extra = pass_fds if pass_fds is not None else []
    try:
        _check_arguments(argv, timeout=timeout, kill_grace=kill_grace, eof_grace=eof_grace)
        fds = [*(script.pass_fds if script is not None else ()), *extra]
        token = secrets.token_hex(16)
        spec = host_spec(
            argv, call_dir=call_dir, cwd=cwd, env={**env, RUN_TOKEN_VAR: token}, as_user=as_user,
            tty=tty, stdin=stdin, pass_fds=fds, spare_wrapper=spare_wrapper, token=token,
            secret=secrets.token_hex(16), spill_max_bytes=spill_max_bytes, timeout=timeout,
            kill_grace=kill_grace, eof_grace=eof_grace, linger=linger)
        try:
            # Shielded (start_host bounds itself): a cancellation that comes while the host
            # starts must not leave it running unseen; the run below sees the cancellation at
            # its first checkpoint and has the host kill the command.
            with trio.CancelScope(shield=True):
                handle = await start_host(spec, fds)
        except HostStartError as exc:
            _settle(capture, on_output)
            return ExecOutcome(exit_code=None, error=str(exc))
    finally:
        if script is not None:
            script.close()
        while extra:
            os.close(extra.pop())
    if on_host is not None:
        on_host(handle)
    outcome = await _Run(handle, capture, on_output, argv, cwd, spare_wrapper).run(cancel,
                                                                                    kill_grace)
    if handle.record is None:  # the host died: what it left must not run on unowned
        abandon(spec, {"pid": handle.pid, "startTime": None}, RUN_TOKEN_VAR)
    return outcome


def _check_arguments(argv: list[str], **seconds: float | None) -> None:
    for name, value in seconds.items():
        if value is not None and not value >= 0:
            raise ValueError(f"{name} must be a non-negative number of seconds, not {value!r}")
    if not argv:
        raise ValueError("run_hosted needs a non-empty argv")


def _settle(capture: OutputCapture, on_output: Callable[[], None]) -> None:
    capture.finish()
    on_output()


class _Run:
    """One call's run through its host: the pump, the log reader, the supervisor."""

    def __init__(self, handle: HostHandle, capture: OutputCapture, on_output: Callable[[], None],
                 argv: list[str], cwd: str, spare_wrapper: str | None) -> None:
        self.handle, self.capture, self.on_output = handle, capture, on_output
        self.argv, self.cwd, self.spare_wrapper = argv, cwd, spare_wrapper
        self.reader = log_reader(handle.dir, handle.segment_bytes)

    async def run(self, cancel: trio.Event, kill_grace: float) -> ExecOutcome:
        handle = self.handle
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handle.pump)
                try:
                    reply = await handle.request("attach")
                except HostRequestError:
                    pass  # gone at once: the record on disk (or none) says how it ended
                else:
                    state = reply.get("state")
                    handle.absorb(state if isinstance(state, dict) else reply)
                async with trio.open_nursery() as reading:
                    reading.start_soon(self._read)  # ends once the record is known
                    await self._supervise(cancel, kill_grace)
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
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_SECONDS):
                await self._kill()
            if not self.capture.finished:
                _settle(self.capture, self.on_output)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await handle.aclose()
            raise
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await handle.aclose()
        return self._outcome(record)

    async def _supervise(self, cancel: trio.Event, kill_grace: float) -> None:
        """Wait for the record (or the end of the connection); on ``cancel``, terminate."""
        handle = self.handle
        async with trio.open_nursery() as nursery:

            async def on_cancel() -> None:
                await cancel.wait()
                if handle.record is None:
                    try:
                        await handle.terminate(kill_grace, "cancelled")
                    except HostRequestError:
                        pass  # it ended meanwhile: the record says how

            nursery.start_soon(on_cancel)
            await handle.wait_ended()
            nursery.cancel_scope.cancel()

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
        _settle(capture, self.on_output)

    async def _kill(self) -> None:
        """Shielded: the time is up; everything of the call is KILLed at once, then the
        record is awaited in a worker thread against the real clock (:func:`_await_record`),
        its output read, and the host released."""
        handle = self.handle
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handle.pump)
                if handle.record is None and not handle.closed:
                    await handle.terminate(0, "killed")
                    record = await trio.to_thread.run_sync(_await_record, handle.dir,
                                                           CLEANUP_SECONDS)
                    if record is not None and handle.record is None:
                        handle.absorb({"record": record})
                if handle.record is not None:
                    await self._last_read(handle.record)
                    if not handle.closed:
                        await handle.release()
                nursery.cancel_scope.cancel()
        except HostRequestError:
            pass

    def _outcome(self, record: dict | None) -> ExecOutcome:
        if record is None:
            return ExecOutcome(exit_code=None, error=(
                f"the call host (pid {self.handle.pid}) died before the command's end was "
                f"recorded: {host_log_tail(self.handle.dir / 'host.log')}"))
        reason = record.get("reason")
        code = record.get("exitCode")
        code = code if isinstance(code, int) else None
        if reason == "spawn-failed":
            return ExecOutcome(exit_code=None, error=spawn_failed_sentence(
                self.argv, self.cwd, record))
        outcome = ExecOutcome(exit_code=code, timed_out=reason == "timeout",
                              cancelled=reason == "cancelled")
        if reason == "killed":  # the host stopped it on its own (its log could not be written)
            outcome.error = str(record.get("message") or "the call host killed the command")
        else:
            outcome.error = wrapper_resource_failure(self.spare_wrapper, code, self.capture.text)
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
