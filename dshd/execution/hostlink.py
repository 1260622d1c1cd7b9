"""The control link to one call host: :class:`HostHandle` and the log reader (HOST.md §4).

Theory of operation: a call host listens on ``control.sock`` in its call directory and speaks JSON
lines (``dshd.callhost.control``). :class:`HostHandle` is the daemon's end of one connection,
already past its hello (``dshd.execution.hosted.connect``): requests carry an ``id`` and wait
for their reply (at most :data:`REQUEST_TIMEOUT`); one :meth:`HostHandle.pump` task reads every
line and hands replies to their waiters and the pushed ``progress`` and ``exit`` events to the
handle's state (``end_offset``, ``first_offset``, ``total_lines``, ``record``), waking
:meth:`HostHandle.wait_progress`. A connection that ends closes the handle: waiting and later
requests fail with ``not-running``. A cancelled pump leaves the handle open for another pump.
:func:`log_reader` reads the call's log for the capture (``dshd.callhost.log.read``, in a worker
thread past 256 KiB).

Hosts outlive daemons (HOST.md §7): :func:`host_record` reads a call dir's ``host.json`` and
:func:`host_alive` checks that its pid still runs with the same ``startTime`` (a reused pid is
another process: never adopted, never signalled). :func:`end_host` ends a host and its command
without a daemon -- what a test fixture or ``python -m dshd hosts --cancel`` uses.
"""

from __future__ import annotations

import base64
import errno
import json
import math
import os
import re
import signal
import stat
import sys
from pathlib import Path

import trio

from dshd.callhost import tree
from dshd.execution.spawn import RESOURCE_ERRNOS

from dshd.execution.capture import Gap

__all__ = ["HostHandle", "HostRequestError", "MAX_LINE", "REQUEST_TIMEOUT", "end_host",
           "host_alive", "host_record", "log_reader",
           "read_line", "record_on_disk", "scan_log"]

#: Longest control line accepted from a host (HOST.md §4).
MAX_LINE = 4 * 1024 * 1024
#: Seconds to wait for a reply to a control request before the host counts as stuck.
REQUEST_TIMEOUT = 30.0


class HostRequestError(Exception):
    """A control request the host refused: ``code`` (``not-running``, ``no-stdin``,
    ``too-big``, ``bad-request``) and ``sentence`` (the host's words, for a person)."""

    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(sentence)
        self.code = code
        self.sentence = sentence


class HostHandle:
    """The daemon's connection to one call's host (module doc; HOST.md §2).

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
        #: One stdin request at a time on the connection: the host reads no further behind
        #: a few unanswered writes (a command that does not read its stdin holds them), and
        #: signal, terminate and release must always get through.
        self._input_lock = trio.Lock()
        self._next_id = 0
        self._waiters: dict[int, list] = {}
        self._changed = trio.Event()
        self._ended = trio.Event()
        self._buffer = bytearray()

    # -- what other rooms use ------------------------------------------------------------
    async def wait_progress(self, end_offset: int) -> None:
        """Return once ``end_offset`` moved past the argument, or the record is known, or the
        connection ended (at once when one of them is already so)."""
        while self.end_offset <= end_offset and self.record is None and not self.closed:
            await self._changed.wait()

    async def wait_ended(self) -> None:
        """Return once the record is known or the connection ended (no wake per progress)."""
        await self._ended.wait()

    async def write(self, data: bytes) -> int:
        """Write ``data`` (≤ 1 MiB) to the command's stdin; the count once all was written."""
        async with self._input_lock:  # answered once written: no timeout (back-pressure)
            reply = await self.request("write", data=base64.b64encode(data).decode("ascii"),
                                       timeout=math.inf)
        return int(reply.get("written", len(data)))

    async def close_stdin(self) -> None:
        async with self._input_lock:
            await self.request("close-stdin", timeout=math.inf)

    async def resize(self, cols: int, rows: int) -> None:
        await self.request("resize", cols=cols, rows=rows)

    async def signal(self, name: str) -> None:
        await self.request("signal", signal=name)

    # -- what the runner uses ------------------------------------------------------------
    async def terminate(self, grace: float, reason: str) -> None:
        await self.request("terminate", grace=grace, reason=reason)

    async def release(self) -> None:
        await self.request("release")

    async def request(self, op: str, *, timeout: float = REQUEST_TIMEOUT,
                      **fields: object) -> dict:
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
                # Shielded (bounded): a send cut off by a cancellation (a client that went
                # away mid-write) would leave half a line, which the host reads as garbage
                # and closes the connection over -- and a lost connection ends the command.
                with trio.CancelScope(shield=True), trio.move_on_after(REQUEST_TIMEOUT) as sent:
                    try:
                        await self._stream.send_all(line)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        self._close()
                if sent.cancelled_caught:
                    self._close()
            with trio.move_on_after(timeout):
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
        if self.record is not None or self.closed:
            self._ended.set()
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


async def read_line(handle: HostHandle) -> dict | None:
    """The next line from the host as a dict (``{}`` for a malformed one), None at the end."""
    return await handle._read_line()


def scan_log(directory: Path):
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
        try:
            return await trio.to_thread.run_sync(read_all, offset, limit)
        except RuntimeError:
            # No worker thread could be started (threads or pids exhausted): read here in
            # the trio thread rather than fail the call.
            return read_all(offset, limit)

    return read


#: Largest ``host.json`` / ``exit.json`` read (each is a few hundred bytes).
RECORD_MAX = 65536
#: The environment variable that carries a run's kill-sweep token (HOST.md §4).
RUN_TOKEN_VAR = "DSH_RUN"
_INT_MAX = (1 << 53) - 1  # what JSON numbers carry exactly


def read_record(path: Path) -> dict | None:
    """A small JSON object file of a call dir, or None: never follows a symlink, never blocks
    on a FIFO or a device, never reads past :data:`RECORD_MAX`, and only trusts a regular file
    owned by this process's uid (the host writes both as the daemon's uid)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_size > RECORD_MAX
                or st.st_uid != os.geteuid()):
            return None
        data = os.read(fd, RECORD_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        value = json.loads(data) if len(data) <= RECORD_MAX else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _count(value: object, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _INT_MAX


def record_on_disk(directory: Path) -> dict | None:
    """The call's ``exit.json`` (HOST.md §3) when it is one: an exit code and signal that are
    small integers or null, and byte and line counts a log can have; anything else is no
    record (the call's outcome is then unknown, never an internal error)."""
    value = read_record(Path(directory) / "exit.json")
    if value is None:
        return None
    code, sig = value.get("exitCode"), value.get("signal")
    ok = (all(v is None or (isinstance(v, int) and not isinstance(v, bool)
                            and -(1 << 31) <= v < (1 << 31)) for v in (code, sig))
          and _count(value.get("totalBytes"), optional=True)
          and _count(value.get("totalLines"), optional=True)
          and _count(value.get("firstOffset"), optional=True)
          and int(value.get("firstOffset") or 0) <= int(value.get("totalBytes") or 0))
    return value if ok else None


def abandon(spec: dict, ready: dict, token_var: str) -> None:
    """SIGKILL a call's host and everything of its command (its tree, the run's token
    carriers) when the daemon cannot own it: a host it could not reach, or one that died
    without an exit record (its orphans, re-parented to pid 1, still carry the token)."""
    pid, start_time = int(ready.get("pid") or 0), ready.get("startTime")
    uid = spec["user"]["uid"] if spec.get("user") else os.geteuid()
    marker = f"{token_var}={spec['token']}"
    leader = ready.get("commandPid")
    tree.kill_tree(pid, leader if isinstance(leader, int) else None, spec["spare_wrapper"],
                   marker, uid)
    st = tree.proc_stat(pid) if pid > 0 else None
    if st is not None and st.start_time == start_time:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def host_log_tail(path: Path) -> str:
    """The last line of a host's ``host.log`` (why it gave up), or what can be said without
    one: a host on a full file system could not even write its log."""
    try:
        text = path.read_bytes()[-2000:].decode(errors="replace").strip()
    except OSError:
        text = ""
    if text:
        return text.splitlines()[-1]
    try:
        full = os.statvfs(path.parent).f_bavail == 0
    except OSError:
        full = False
    if full:
        return (f"the file system of {path.parent} is full (ENOSPC): the host could write "
                "neither its output nor its exit record; free space, then run the call again")
    return f"it exited without a word (see {path})"


def start_sentence(exc: OSError) -> str:
    if exc.errno in RESOURCE_ERRNOS:
        return (f"Could not start the command: could not start a thread/process: resource limit "
                f"({errno.errorcode[exc.errno]}: {exc.strerror}); too many processes or threads "
                "run as this user (RLIMIT_NPROC, a cgroup's pids.max) or memory is short. Stop "
                "some, then run it again.")
    return f"Could not start the call host ({sys.executable}): {exc.strerror or exc}"


# ----------------------------------------------------------------------------- adoption
#: Seconds :func:`end_host` gives a host to stop its command (TERM, the call's kill grace,
#: KILL) and exit before it SIGKILLs what is left.
END_HOST_SECONDS = 10.0


_TOKEN = re.compile(r"[0-9a-f]{32}")


def host_record(directory: Path) -> dict | None:
    """``host.json`` of a call dir (HOST.md §3), or None when missing, unreadable
    (:func:`read_record`) or not one a host writes: a positive pid, an integer start time, the
    run's token variable with a token of 32 hex digits, and integer uid and command pid when
    present -- what :func:`abandon` and :func:`end_host` would act on is never forged freely
    (the sweep only reaches processes that carry ``DSH_RUN=<that token>``)."""
    value = read_record(Path(directory) / "host.json")
    if value is None:
        return None
    pid, start_time = value.get("pid"), value.get("startTime")
    ok = (_count(pid) and pid > 0 and _count(start_time)
          and value.get("tokenVar", RUN_TOKEN_VAR) == RUN_TOKEN_VAR
          and isinstance(value.get("token", "0" * 32), str)
          and _TOKEN.fullmatch(value.get("token", "0" * 32)) is not None
          and _count(value.get("uid"), optional=True)
          and _count(value.get("commandPid"), optional=True))
    return value if ok else None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None


def _is_call_host(pid: int) -> bool:
    """``pid`` runs as this uid and is a call host (``.../callhost/main.py`` in its argv)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(65536).split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"/callhost/main.py") for arg in argv)


def host_alive(record: dict | None) -> bool:
    """The host ``record`` describes still runs: its pid is alive with the same ``startTime``
    (``/proc/PID/stat`` field 22) in the same boot (``bootId``, when the record has one), as
    this uid, and is a call host by its argv. A reused pid (another process now), a process of
    another user or one that is no call host is not alive, so it is never adopted or
    signalled."""
    if not record:
        return False
    pid, start_time = record.get("pid"), record.get("startTime")
    if not isinstance(pid, int) or pid <= 1 or not isinstance(start_time, int):
        return False
    boot = record.get("bootId")
    if boot is not None and boot != _boot_id():
        return False
    st = tree.proc_stat(pid)
    return st is not None and st.start_time == start_time and _is_call_host(pid)


def sweep_carriers(record: dict | None) -> int:
    """SIGKILL what is left of a dead host's command: the processes of the command's uid that
    carry the run's token (a host killed while no daemon ran leaves its orphans running
    unowned: its tree was never swept). No-op without a valid token; how many were hit."""
    if not record or not isinstance(record.get("token"), str):
        return 0
    uid = record.get("uid") if isinstance(record.get("uid"), int) else os.geteuid()
    return tree.kill_tree(-1, None, None, f"{RUN_TOKEN_VAR}={record['token']}", uid)


def _ask_to_end(directory: Path, record: dict, grace: float) -> bool:
    """Tell a live host, over its control socket, to terminate its command (reason
    ``cancelled``) and exit once its record is durable; False when it could not be told."""
    import socket

    dirfd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(f"/proc/self/fd/{dirfd}/{record.get('control', 'control.sock')}")
            lines = [{"hello": 1, "secret": record.get("secret", "")},
                     {"id": 1, "op": "terminate", "grace": grace, "reason": "cancelled"},
                     {"id": 2, "op": "release"}]
            sock.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
            got = b""
            while got.count(b"\n") < 3:
                data = sock.recv(65536)
                if not data:
                    break
                got += data
            return b'"hello"' in got
    except OSError:
        return False
    finally:
        os.close(dirfd)


def end_host(call_dir: Path, *, seconds: float = END_HOST_SECONDS) -> bool:
    """End the call host of ``call_dir`` and its command for good, without a daemon (test
    fixtures, ``python -m dshd hosts --cancel``): a live host (:func:`host_alive`) is asked
    to terminate its command (TERM, its kill grace, KILL; reason ``cancelled``, so its
    ``exit.json`` says so) and to exit; one that has not exited within ``seconds`` is
    SIGKILLed with its tree, as :func:`abandon` does. The run's token carriers are swept
    unless the host is gone and left its exit record (it swept them itself). True when a live host was found. Synchronous, bounded."""
    import time

    directory = Path(call_dir)
    record = host_record(directory)
    if record is None:
        return False
    alive = host_alive(record)
    pid = int(record["pid"]) if alive else -1  # -1 is nobody's parent: no tree to walk
    if alive:
        grace = record.get("killGrace")
        grace = float(grace) if isinstance(grace, (int, float)) else 2.0
        grace = min(grace, max(seconds / 2, 0.0))
        _ask_to_end(directory, record, grace)
        deadline = time.monotonic() + seconds
        while host_alive(record) and time.monotonic() < deadline:
            time.sleep(0.02)
    token, var = record.get("token"), record.get("tokenVar")
    marker = f"{var}={token}" if isinstance(token, str) and isinstance(var, str) else None
    leader = record.get("commandPid")
    uid = record.get("uid") if isinstance(record.get("uid"), int) else os.geteuid()
    spare = record.get("spareWrapper") if isinstance(record.get("spareWrapper"), str) else None
    if alive and host_alive(record):
        tree.kill_tree(pid, leader if isinstance(leader, int) else None, spare, marker, uid)
        if host_alive(record):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    elif marker is not None and record_on_disk(directory) is None:
        # A host that wrote its exit record swept its own tree at the end (HOST.md §5): only
        # one that died without it can have left token carriers behind.
        tree.kill_tree(-1, None, None, marker, uid)
    return alive
