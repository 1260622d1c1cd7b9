"""The daemon's side of a call host: start it, talk to it, run the call to an outcome (HOST.md).

Theory of operation
-------------------
A tool call's command is owned by a *call host* (:mod:`dshd.callhost`, stdlib only): one
process per call, started detached, the command's subreaper, owner of its PTY or pipes, its
stdin and its raw output log ``<call dir>/output.raw`` (segments), which writes ``exit.json``
durably when the command ends. This module is everything the daemon does with one:

* **Start** (:func:`start_host`): ``[sys.executable, "-I", "-S", <dshd/callhost/main.py>]`` is
  ``Popen``'d *in the trio thread* (a worker thread's exit would fire a ``PR_SET_PDEATHSIG``
  set up in it) with stdin and stdout on pipes, stderr on the call's ``host.log``,
  ``close_fds``, ``pass_fds`` = the script's memfd and the sandbox's fds, its own session,
  cwd ``/``. The daemon writes ONE JSON spec (plan §B) and closes stdin; the host double-forks
  (the intermediate exits at once and is reaped here, so the host proper is pid 1's child and
  holds no daemon descriptor) and writes ONE ready line ``{"ok": true, "pid", "startTime",
  "control", "commandPid"}`` (or ``{"ok": false, "error"}``: :class:`HostStartError`).
* **Control** (:class:`HostHandle`): an abstract Unix stream socket, JSON lines. The first line
  carries the spec's random secret (the host also checks ``SO_PEERCRED``); then ``attach``
  starts the host's pushed ``progress`` events (``endOffset``, ``firstOffset``, ``totalLines``)
  and the one ``exit`` event (the exit record, once durable). Requests carry an ``id``; one
  pump task reads every line and hands replies to their waiters. ``write``, ``close-stdin``,
  ``resize`` and ``signal`` are what the raw room's methods use (``Call.host``); an error reply
  is :class:`HostRequestError` (``code``, ``sentence``). A connection that ends makes every
  waiting request fail with ``not-running``.
* **Run** (:func:`run_hosted`): progress → the call's :class:`~dshd.execution.capture.
  OutputCapture` reads what is new from the log (:func:`~dshd.execution.capture.catch_up`:
  the file read in a worker thread, the window work in the trio thread; at most one read per
  :data:`READ_INTERVAL` while output flows, so the daemon's CPU grows with publishes, not with
  bytes) → ``on_output()``. The ``cancel`` event → ``terminate {grace: kill_grace, reason:
  "cancelled"}`` (the host sends TERM to the command, KILL to the whole tree after the grace).
  The timeout is the host's (spec ``timeout``: reason ``timeout``). A cancellation from
  outside (the session's stop deadline) or an error of the run → ``terminate {grace: 0,
  reason: "killed"}``, shielded and bounded, before it propagates. The exit record →
  :class:`ExecOutcome`; then ``release`` (the host exits once the record is durable). A host
  whose connection ends with no exit record (and no ``exit.json``) died: an error outcome.
"""

from __future__ import annotations

import base64
import errno
import json
import math
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import trio


from dshd.execution.capture import Gap, OutputCapture, catch_up
from dshd.execution.spawn import RESOURCE_ERRNOS, BashScript, RunAs, spawn, spawn_sentence

__all__ = ["ExecOutcome", "HostHandle", "HostRequestError", "HostStartError", "HOST_MAIN",
           "RUN_TOKEN_VAR", "run_hosted", "start_host"]

#: The host program, started by absolute path with ``python3 -I -S`` (HOST.md §2).
HOST_MAIN = Path(__file__).resolve().parent.parent / "callhost" / "main.py"
#: The environment variable that carries a run's kill-sweep token (the host's sweep keys on it).
RUN_TOKEN_VAR = "DSH_RUN"
#: Seconds a host may take to answer its spec with the ready line.
START_TIMEOUT = 30.0
#: Longest control line accepted from a host (plan §C).
MAX_LINE = 4 * 1024 * 1024
#: Seconds between two reads of the log while output flows (the first one of a burst is at once).
READ_INTERVAL = 0.05
#: Seconds the shielded cleanup after an outside cancellation may take (terminate, wait for the
#: record, a last read, release).
CLEANUP_SECONDS = 10.0
#: Seconds to wait for a reply to a control request before the host counts as stuck.
REQUEST_TIMEOUT = 30.0


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


class HostRequestError(Exception):
    """A control request the host refused: ``code`` (``not-running``, ``no-stdin``,
    ``too-big``, ``bad-request``) and ``sentence`` (the host's words, for a person)."""

    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(sentence)
        self.code = code
        self.sentence = sentence


class HostHandle:
    """The daemon's connection to one call's host (module doc; plan §D).

    ``dir``: the call dir. ``tty`` / ``stdin_pipe``: how the command's input was set up.
    ``first_offset`` / ``end_offset`` / ``total_lines``: the log's extent as last reported.
    ``record``: the exit record once known. ``pid``: the host's pid.
    """

    def __init__(self, directory: Path, stream: trio.SocketStream, *, pid: int, tty: bool,
                 stdin_pipe: bool, segment_bytes: int) -> None:
        self.dir = directory
        self.pid = pid
        self.tty = tty
        self.stdin_pipe = stdin_pipe
        self.segment_bytes = segment_bytes
        self.first_offset = 0
        self.end_offset = 0
        self.total_lines = 0
        self.record: dict | None = None
        #: The connection ended (the host exited or died); requests fail with not-running.
        self.closed = False
        self._stream = stream
        self._send_lock = trio.Lock()
        self._next_id = 0
        self._waiters: dict[int, list] = {}
        self._changed = trio.Event()
        self._buffer = bytearray()

    # -- what other rooms use ------------------------------------------------------------
    async def wait_progress(self, end_offset: int) -> None:
        """Return once ``end_offset`` moved past the argument, or the record is known, or the
        connection ended (at once when one of them is already so)."""
        while self.end_offset <= end_offset and self.record is None and not self.closed:
            await self._changed.wait()

    async def write(self, data: bytes) -> int:
        """Write ``data`` (≤ 1 MiB) to the command's stdin; the count once all was written."""
        reply = await self.request("write", data=base64.b64encode(data).decode("ascii"))
        return int(reply.get("written", len(data)))

    async def close_stdin(self) -> None:
        await self.request("close-stdin")

    async def resize(self, cols: int, rows: int) -> None:
        await self.request("resize", cols=cols, rows=rows)

    async def signal(self, name: str) -> None:
        await self.request("signal", signal=name)

    # -- what the runner uses ------------------------------------------------------------
    async def terminate(self, grace: float, reason: str) -> None:
        await self.request("terminate", grace=grace, reason=reason)

    async def release(self) -> None:
        await self.request("release")

    async def request(self, op: str, **fields: object) -> dict:
        """Send ``{"id", "op", **fields}`` and return the reply (``HostRequestError`` for an
        error reply, or ``not-running`` when the connection ended first)."""
        if self.closed:
            raise HostRequestError("not-running", self._gone_sentence())
        self._next_id += 1
        rid = self._next_id
        done = trio.Event()
        slot: list = [done, None]
        self._waiters[rid] = slot
        try:
            line = json.dumps({"id": rid, "op": op, **fields}).encode() + b"\n"
            async with self._send_lock:
                try:
                    await self._stream.send_all(line)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    self._close()
            with trio.move_on_after(REQUEST_TIMEOUT):
                await done.wait()
        finally:
            self._waiters.pop(rid, None)
        reply = slot[1]
        if reply is None:
            if self.closed:
                raise HostRequestError("not-running", self._gone_sentence())
            raise HostRequestError("bad-request", f"the call host (pid {self.pid}) did not "
                                   f"answer {op!r} within {REQUEST_TIMEOUT:g} s")
        if not reply.get("ok"):
            raise HostRequestError(str(reply.get("code", "bad-request")),
                                   str(reply.get("error", "the call host refused the request")))
        return reply

    async def pump(self) -> None:
        """Read every line from the host until the connection ends: replies to their
        waiters, ``progress`` and ``exit`` events into the handle's state. A cancelled pump
        leaves the handle open (another pump may take over); the end of the connection
        closes it."""
        while True:
            line = await self._read_line()
            if line is None:
                self._close()
                return
            self._dispatch(line)

    def _gone_sentence(self) -> str:
        if self.record is not None:
            return "the command has ended; the call's host no longer takes requests"
        return f"the call host (pid {self.pid}) is not reachable any more"

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for slot in self._waiters.values():
            slot[0].set()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _read_line(self) -> dict | None:
        while True:
            cut = self._buffer.find(b"\n")
            if cut >= 0:
                raw = bytes(self._buffer[:cut])
                del self._buffer[:cut + 1]
                try:
                    value = json.loads(raw)
                except ValueError:
                    return {}
                return value if isinstance(value, dict) else {}
            if len(self._buffer) > MAX_LINE:
                return None  # a host that says nonsense: treat as gone
            try:
                data = await self._stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return None
            if not data:
                return None
            self._buffer += data

    def _dispatch(self, message: dict) -> None:
        event = message.get("event")
        if event == "progress":
            self._progress(message)
        elif event == "exit":
            record = message.get("record")
            if isinstance(record, dict):
                self._progress(record, end_key="totalBytes")
                self.record = record
            self._wake()
        elif "id" in message:
            slot = self._waiters.get(message["id"])
            if slot is not None:
                slot[1] = message
                slot[0].set()

    def _progress(self, state: dict, end_key: str = "endOffset") -> None:
        end = state.get(end_key)
        if isinstance(end, int) and end > self.end_offset:
            self.end_offset = end
        first = state.get("firstOffset")
        if isinstance(first, int) and first > self.first_offset:
            self.first_offset = first
        lines = state.get("totalLines")
        if isinstance(lines, int):
            self.total_lines = lines
        self._wake()

    def absorb(self, state: dict) -> None:
        """Take an ``attach`` or ``status`` reply's state (progress, maybe the record)."""
        self._progress(state)
        record = state.get("record")
        if isinstance(record, dict) and self.record is None:
            self._progress(record, end_key="totalBytes")
            self.record = record
            self._wake()

    async def aclose(self) -> None:
        self._close()
        await self._stream.aclose()


# ----------------------------------------------------------------------------- starting
def host_spec(argv: list[str], *, call_dir: Path, cwd: str, env: dict[str, str],
              as_user: RunAs | None, tty: tuple[int, int, str] | None, stdin: str,
              pass_fds: list[int], spare_wrapper: str | None, token: str, secret: str,
              spill_max_bytes: int, timeout: float | None, kill_grace: float,
              eof_grace: float, linger: float) -> dict:
    """The host's spec (plan §B, version 1)."""
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
        log_fd = os.open(call_dir / "host.log",
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW,
                         0o600)
        try:
            child = spawn([sys.executable, "-I", "-S", str(HOST_MAIN)], stdin=in_r, stdout=out_w,
                          stderr=log_fd, close_fds=True, pass_fds=tuple(pass_fds),
                          start_new_session=True, cwd="/")
        except OSError as exc:
            raise HostStartError(_start_sentence(exc)) from None
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
            raise HostStartError(f"the call host did not report ready within "
                                 f"{START_TIMEOUT:g} s; see {call_dir / 'host.log'}")
    finally:
        await spec_in.aclose()
        await ready_out.aclose()
        child.close()
    if ready is None or not ready.get("ok"):
        reason = (ready or {}).get("error") or _log_tail(call_dir / "host.log")
        raise HostStartError(f"the call host could not start the call: {reason}")
    return await connect(ready, spec)


async def connect(ready: dict, spec: dict) -> HostHandle:
    """Connect to the host's control socket, say hello with the secret, and ``attach``."""
    pid = int(ready.get("pid", 0))
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    try:
        await sock.connect("\0" + str(ready["control"]))
    except (OSError, KeyError) as exc:
        sock.close()
        raise HostStartError(f"could not reach the call host (pid {pid}): {exc}") from None
    stream = trio.SocketStream(sock)
    handle = HostHandle(Path(spec["dir"]), stream, pid=pid, tty=spec["tty"] is not None,
                        stdin_pipe=spec["stdin"] == "pipe", segment_bytes=spec["segment_bytes"])
    try:
        await stream.send_all(json.dumps({"hello": 1, "secret": spec["secret"]}).encode() + b"\n")
        with trio.move_on_after(START_TIMEOUT):
            hello = await handle._read_line()
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


def _log_tail(path: Path) -> str:
    try:
        text = path.read_bytes()[-2000:].decode(errors="replace").strip()
    except OSError:
        text = ""
    return text.splitlines()[-1] if text else f"it exited without a word (see {path})"


def _start_sentence(exc: OSError) -> str:
    if exc.errno in RESOURCE_ERRNOS:
        return (f"Could not start the command: could not start a thread/process: resource limit "
                f"({errno.errorcode[exc.errno]}: {exc.strerror}); too many processes or threads "
                "run as this user (RLIMIT_NPROC, a cgroup's pids.max) or memory is short. Stop "
                "some, then run it again.")
    return f"Could not start the call host ({sys.executable}): {exc.strerror or exc}"


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
    return await _Run(handle, capture, on_output, argv, cwd, spare_wrapper).run(cancel,
                                                                                 kill_grace)


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
                record = handle.record or _record_on_disk(handle.dir)
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
            while handle.record is None and not handle.closed:
                await handle.wait_progress(handle.end_offset)
            nursery.cancel_scope.cancel()

    async def _read(self) -> None:
        """Bring the capture up to the host's reported end, at most once per READ_INTERVAL."""
        handle, capture = self.handle, self.capture
        while True:
            seen = handle.end_offset
            if seen > capture.read_offset or handle.first_offset > capture.read_offset:
                await catch_up(capture, self.reader, seen, handle.first_offset,
                               handle.total_lines)
                self.on_output()
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
            extent = await trio.to_thread.run_sync(_scan, handle.dir)
            end, first, lines = (max(handle.end_offset, extent.end_offset),
                                 max(handle.first_offset, extent.first_offset), handle.total_lines)
        await catch_up(capture, self.reader, end, first, lines)
        _settle(capture, self.on_output)

    async def _kill(self) -> None:
        """Shielded: the time is up; everything of the call is KILLed at once."""
        handle = self.handle
        if handle.record is not None or handle.closed:
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handle.pump)
                await handle.terminate(0, "killed")
                while handle.record is None and not handle.closed:
                    await handle.wait_progress(handle.end_offset)
                nursery.cancel_scope.cancel()
        except HostRequestError:
            pass
        if handle.record is not None:
            try:
                await handle.release()
            except HostRequestError:
                pass

    def _outcome(self, record: dict | None) -> ExecOutcome:
        if record is None:
            return ExecOutcome(exit_code=None, error=(
                f"the call host (pid {self.handle.pid}) died before the command's end was "
                f"recorded: {_log_tail(self.handle.dir / 'host.log')}"))
        reason = record.get("reason")
        code = record.get("exitCode")
        code = code if isinstance(code, int) else None
        if reason == "spawn-failed":
            return ExecOutcome(exit_code=None, error=spawn_failed_sentence(
                self.argv, self.cwd, record))
        outcome = ExecOutcome(exit_code=code, timed_out=reason == "timeout",
                              cancelled=reason in ("cancelled", "killed"))
        outcome.error = wrapper_resource_failure(self.spare_wrapper, code, self.capture.text)
        return outcome


def _scan(directory: Path):
    from dshd.callhost import log as hostlog  # the host room's reader (stdlib, sync)

    return hostlog.scan(directory)


def log_reader(directory: Path, segment_bytes: int):
    """The capture's reader of the call's log (:func:`~dshd.execution.capture.catch_up`):
    ``dshd.callhost.log.read`` looped to the limit, in a worker thread past 256 KiB; the
    host's ``Gap`` becomes the capture's."""
    from dshd.callhost import log as hostlog

    def read_all(offset: int, limit: int) -> bytes:
        parts, got = [], 0
        while got < limit:
            try:
                data = hostlog.read(directory, offset + got, limit - got, segment_bytes)
            except hostlog.Gap as exc:
                raise Gap(exc.first_offset) from None
            if not data:
                break
            parts.append(data)
            got += len(data)
        return b"".join(parts)

    async def read(offset: int, limit: int) -> bytes:
        if limit <= 256 * 1024:
            return read_all(offset, limit)
        return await trio.to_thread.run_sync(read_all, offset, limit)

    return read


def _record_on_disk(directory: Path) -> dict | None:
    try:
        value = json.loads((directory / "exit.json").read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def spawn_failed_sentence(argv: list[str], cwd: str, record: dict) -> str:
    """The sentence of a ``spawn-failed`` exit record, worded as a spawn failure in-process
    was (:func:`~dshd.execution.spawn.spawn_sentence`)."""
    name = str(record.get("errno") or "")
    number = getattr(errno, name, None) if name.isupper() else None
    message = str(record.get("message") or (os.strerror(number) if number else "failed"))
    if number is None:
        return f"Could not start the command: {message}"
    filename = cwd if "directory" in message.lower() or cwd in message else argv[0]
    return spawn_sentence(argv, cwd, OSError(number, os.strerror(number), filename))


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
