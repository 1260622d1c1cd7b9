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

Hosts outlive daemons (HOST.md §7): reading a call dir's ``host.json`` / ``exit.json``, the
host's identity check and ending a host without a daemon are ``dshd.execution.hostfiles``
(its names are importable from here too). :func:`abandon` SIGKILLs a host the daemon cannot
own, with its command's tree and the run's token carriers.
"""

from __future__ import annotations

import base64
import errno
import json
import math
import os
import signal
import sys
from pathlib import Path

import trio

from dshd.callhost import tree
from dshd.execution.spawn import RESOURCE_ERRNOS

from dshd.execution.capture import Gap
# The records' readers live in hostfiles; the link's importers take them from here too.
from dshd.execution.hostfiles import (
    END_HOST_SECONDS, RECORD_MAX, RUN_TOKEN_VAR, end_host, host_alive, host_record, read_record,
    record_on_disk, sweep_carriers,
)

__all__ = ["END_HOST_SECONDS", "HostHandle", "HostRequestError", "MAX_LINE", "RECORD_MAX",
           "REQUEST_TIMEOUT", "RUN_TOKEN_VAR", "abandon", "end_host", "host_alive",
           "host_record", "log_reader", "read_line", "read_record", "record_on_disk",
           "scan_log", "sweep_carriers"]

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
