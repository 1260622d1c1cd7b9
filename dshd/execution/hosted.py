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
* **Run** (:func:`run_hosted`): the host is started with ``on_daemon_loss`` ``"keep"``
  (``on_stop = "detach"``) or ``"terminate"`` and driven by :class:`~dshd.execution.hostrun.
  HostRun` (``dshd.execution.hostrun``: progress → the call's :class:`~dshd.execution.capture.
  OutputCapture` reads what is new from the log, paced; ``cancel`` → ``terminate``; the exit
  record → :class:`ExecOutcome`, then ``release``; ``detach`` → the command runs on). A host
  whose connection ends with no exit record (and no ``exit.json``) died: an error outcome, and
  what it left is SIGKILLed (:func:`~dshd.execution.hostlink.abandon`); so is a host that does
  not report the end in time after a cancel, a timeout or a kill (``hostrun``'s module doc).
* **Adopt** (HOST.md §7): after a daemon restart, :func:`adopt_hosted` connects to a live host
  named by its ``host.json`` (pid and ``startTime`` checked by the caller, the secret from the
  file) and runs the same :class:`~dshd.execution.hostrun.HostRun`; :func:`finished_outcome`
  turns the ``exit.json`` of a host that ended while no daemon ran into the outcome, its output
  read from the log.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

import trio


from dshd.execution.capture import OutputCapture, catch_up
from dshd.execution.hostlink import (
    MAX_LINE, HostHandle, HostRequestError, abandon, host_log_tail, log_reader, read_line,
    RUN_TOKEN_VAR, host_alive, host_record, record_on_disk, scan_log, start_sentence,
)
from dshd.execution.hostrun import (
    CLEANUP_SECONDS, READ_INTERVAL, SMALL_READ, TURNOVER_INTERVAL, ExecOutcome, HostRun,
    host_killer, outcome_of, settle_capture, spawn_failed_sentence, wrapper_resource_failure,
)
from dshd.execution.spawn import RESOURCE_ERRNOS, BashScript, RunAs, spawn

__all__ = ["CLEANUP_SECONDS", "ExecOutcome", "HostHandle", "HostRequestError", "HostStartError",
           "HOST_MAIN", "READ_INTERVAL", "RUN_TOKEN_VAR", "SMALL_READ", "TURNOVER_INTERVAL",
           "adopt_hosted", "finished_outcome", "run_hosted", "spawn_failed_sentence",
           "start_host", "wrapper_resource_failure"]

#: The host program, started by absolute path with ``python3 -I -S`` (HOST.md §2).
HOST_MAIN = Path(__file__).resolve().parent.parent / "callhost" / "main.py"
#: The interpreter the host runs on: the daemon's own binary, by its magic link. Its path
#: (``sys.executable``, a venv's symlink chain) may pass through a directory the daemon's
#: user cannot search — a Python installed under /root for a daemon that runs as another
#: user — which the exec of a magic link never walks.
HOST_INTERPRETER = "/proc/self/exe"
#: Seconds a host may take to answer its spec with the ready line.
START_TIMEOUT = 30.0


class HostStartError(Exception):
    """The host could not be started or refused its spec; ``str()`` is the sentence."""



# ----------------------------------------------------------------------------- starting
def host_spec(argv: list[str], *, call_dir: Path, cwd: str, env: dict[str, str],
              as_user: RunAs | None, tty: tuple[int, int, str] | None, stdin: str,
              pass_fds: list[int], spare_wrapper: str | None, token: str, secret: str,
              spill_max_bytes: int, timeout: float | None, kill_grace: float,
              eof_grace: float, linger: float, on_daemon_loss: str = "terminate",
              daemon: dict | None = None) -> dict:
    """The host's spec (HOST.md §2, version 1); ``daemon``: notes the host keeps in
    ``host.json`` for a daemon that adopts it after a restart (HOST.md §7)."""
    return {
        "version": 1, "dir": str(call_dir), "argv": argv, "cwd": cwd, "env": env,
        "user": (None if as_user is None else
                 {"uid": as_user.uid, "gid": as_user.gid, "groups": list(as_user.groups)}),
        "tty": None if tty is None else {"cols": tty[0], "rows": tty[1], "term": tty[2]},
        "stdin": "pipe" if tty is not None else stdin, "pass_fds": list(pass_fds),
        "spare_wrapper": spare_wrapper, "token_var": RUN_TOKEN_VAR, "token": token,
        "spill_max_bytes": spill_max_bytes, "segment_bytes": max(spill_max_bytes // 4, 4096),
        "timeout": timeout, "kill_grace": kill_grace, "eof_grace": eof_grace,
        "linger": linger, "secret": secret, "on_daemon_loss": on_daemon_loss,
        "daemon": dict(daemon or {}),
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
        hello = None  # a host that never answers within the bound is refused below
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
    on_daemon_loss: str = "terminate",
    detach: trio.Event | None = None,
    daemon_notes: dict | None = None,
) -> ExecOutcome:
    """Run ``argv`` under a new call host in ``call_dir`` (which must exist, 0700) to an
    :class:`ExecOutcome`, feeding ``capture`` from the host's log; see the module doc.

    ``script`` and ``pass_fds`` are closed (the list emptied) in every case. ``tty``: ``(cols,
    rows, TERM)`` for a PTY, None for pipes; ``stdin``: ``"null"`` or ``"pipe"``. ``on_host``:
    called with the handle once the host runs (``Call.host``). ``on_daemon_loss``: the spec's
    (``"keep"`` when the daemon detaches on stop); ``detach``: when set, the run lets go of
    the running command (``ExecOutcome.detached``); ``daemon_notes``: kept in ``host.json``
    for the daemon that adopts the host (HOST.md §7). Raises ``ValueError`` for an
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
            kill_grace=kill_grace, eof_grace=eof_grace, linger=linger,
            on_daemon_loss=on_daemon_loss, daemon=daemon_notes)
        try:
            # Shielded (start_host bounds itself): a cancellation that comes while the host
            # starts must not leave it running unseen; the run below sees the cancellation at
            # its first checkpoint and has the host kill the command.
            with trio.CancelScope(shield=True):
                handle = await start_host(spec, fds)
        except HostStartError as exc:
            settle_capture(capture, on_output)
            return ExecOutcome(exit_code=None, error=str(exc))
    finally:
        if script is not None:
            script.close()
        while extra:
            os.close(extra.pop())
    if on_host is not None:
        on_host(handle)
    ready = host_record(call_dir) or {}  # written before the ready line: pid, startTime
    if ready.get("pid") != handle.pid:
        ready = {"pid": handle.pid, "startTime": None}  # only the token's carriers are swept
    outcome = await HostRun(handle, capture, on_output, argv, cwd, spare_wrapper,
                            kill=host_killer(spec, ready, RUN_TOKEN_VAR)).run(
        cancel, kill_grace, detach, timeout)
    if handle.record is None and not outcome.detached:
        # the host died: what it left must not run on unowned
        abandon(spec, {"pid": handle.pid, "startTime": None}, RUN_TOKEN_VAR)
    return outcome


def _check_arguments(argv: list[str], **seconds: float | None) -> None:
    for name, value in seconds.items():
        if value is not None and not value >= 0:
            raise ValueError(f"{name} must be a non-negative number of seconds, not {value!r}")
    if not argv:
        raise ValueError("run_hosted needs a non-empty argv")




# ----------------------------------------------------------------------------- adopting
def _adopted_spec(call_dir: Path, record: dict) -> dict:
    """What :func:`connect` and :func:`abandon` need, rebuilt from ``host.json``."""
    spare = record.get("spareWrapper")
    uid = record.get("uid")
    return {"dir": str(call_dir), "tty": {} if record.get("tty") else None,
            "stdin": record.get("stdin", "null"),
            "segment_bytes": int(record.get("segmentBytes") or 4096),
            "secret": str(record.get("secret", "")), "token": str(record.get("token", "")),
            "spare_wrapper": spare if isinstance(spare, str) else None,
            "user": {"uid": uid} if isinstance(uid, int) else None}


async def adopt_hosted(call_dir: Path, record: dict, *, capture: OutputCapture,
                       on_output: Callable[[], None], cancel: trio.Event,
                       kill_grace: float = 2.0, cwd: str = "/",
                       detach: trio.Event | None = None,
                       on_host: Callable[[HostHandle], None] | None = None) -> ExecOutcome:
    """Re-attach to the live call host of ``call_dir`` (``record``: its ``host.json``) after a
    daemon restart and run the call to its outcome as :func:`run_hosted` does (HOST.md §7): the
    ``attach`` reply gives the current extent and ``capture`` (new, empty) is rebuilt from
    the log; an ended command's record comes at once. A host that cannot be reached is
    SIGKILLed with its tree (nothing runs on unowned) and the outcome is an error."""
    spec = _adopted_spec(call_dir, record)
    ready = {"pid": record.get("pid"), "startTime": record.get("startTime"),
             "control": record.get("control", "control.sock"),
             "commandPid": record.get("commandPid")}
    try:
        with trio.CancelScope(shield=True):
            handle = await connect(ready, spec)
    except HostStartError as exc:
        with trio.move_on_after(1.0):  # a host killed as we connected may still be exiting
            while host_alive(record):
                await trio.sleep(0.02)
        alive = host_alive(record)
        abandon(spec, ready, str(record.get("tokenVar") or RUN_TOKEN_VAR))
        exit_record = record_on_disk(call_dir)
        if exit_record is not None:  # it ended (and exited) between the plan and the connect
            return await finished_outcome(call_dir, exit_record, capture=capture,
                                          on_output=on_output,
                                          segment_bytes=spec["segment_bytes"],
                                          spare_wrapper=spec["spare_wrapper"], cwd=cwd)
        settle_capture(capture, on_output)
        if not alive:  # it died as the daemon reached for it: say that, not "no hello"
            return ExecOutcome(exit_code=None, error=(
                f"the call host (pid {ready['pid']}) died before the command's end was "
                f"recorded: {host_log_tail(call_dir / 'host.log')}"))
        return ExecOutcome(exit_code=None, error=f"after the daemon restart, {exc}")
    if on_host is not None:
        on_host(handle)
    outcome = await HostRun(handle, capture, on_output, ["bash"], cwd, spec["spare_wrapper"],
                            kill=host_killer(spec, ready, str(record.get("tokenVar")
                                                              or RUN_TOKEN_VAR))
                            ).run(cancel, kill_grace, detach)
    if handle.record is None and not outcome.detached:
        abandon(spec, {"pid": handle.pid, "startTime": None},
                str(record.get("tokenVar") or RUN_TOKEN_VAR))
    return outcome


async def finished_outcome(call_dir: Path, exit_record: dict, *, capture: OutputCapture,
                           on_output: Callable[[], None], segment_bytes: int,
                           spare_wrapper: str | None = None, cwd: str = "/") -> ExecOutcome:
    """The outcome of a call whose host ended while no daemon ran (HOST.md §7): ``capture``
    (new, empty) is filled from the log through the record's ``totalBytes`` and the outcome
    is the record's (its real exit code)."""
    reader = log_reader(call_dir, segment_bytes)
    # The record's end, but never past what the log holds (a record that claims more would
    # wait forever for bytes nobody writes).
    extent = await trio.to_thread.run_sync(scan_log, call_dir)
    end = min(int(exit_record.get("totalBytes") or 0), extent.end_offset)
    await catch_up(capture, reader, end,
                   min(int(exit_record.get("firstOffset") or 0), end),
                   int(exit_record.get("totalLines") or 0))
    settle_capture(capture, on_output)
    return outcome_of(exit_record, None, ["bash"], cwd, spare_wrapper, capture.text)
