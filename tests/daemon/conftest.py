"""The daemon test level: a real dshd ``Daemon`` driven through the wire, in one process.

Theory of operation (h11's ``ConnectionPair``, trio's ``memory_stream_pair``):

* :class:`DaemonUnderTest` builds what ``dshd.server.serve`` builds, minus the Unix socket
  and the signals: a real ``Config``, a real state directory under ``tmp_path`` with its real
  ``DaemonLock``, a real sandbox verdict (``probe("none")``: these tests are not about
  confinement, so sessions run ``danger-full-access``), a real ``Daemon`` whose
  ``SessionRegistry`` runs in a nursery, real session logs with real fsync, real bash
  subprocesses, the real scripted model provider.
* :meth:`DaemonUnderTest.connect` serves a real ``dshd.connection.Connection`` (and with it
  the real dispatch) over ``trio.testing.memory_stream_pair``. The test holds the other end as
  a :class:`Wire`: it writes JSON-RPC lines and reads lines, and keeps every message it read,
  in order, so a test can assert what came before what. Stream notifications feed a tiny
  mirror per subscription (:class:`Lane`: ``protocol.codec.Decoder`` + ``protocol.apply``).
  Nothing here calls a handler or a session directly: tests say what a client sends and what
  it reads, so they survive the daemon's restructure.
* The clock is a ``MockClock`` (fixture ``daemon_clock``, which every test of this level must
  request so pytest-trio runs on it) with autojump, made safe for a daemon that does real work
  in worker threads (:class:`ThreadAwareAutojump`). A plain ``MockClock(autojump_threshold=0)``
  jumps to the next deadline whenever no task is runnable *at this instant*, so while a worker
  thread fsyncs the next pending deadline fires at once (when this level was written, a
  third of its tests failed that way: a liveness bound fired while ``session.create`` waited
  for its first fsync; the same would cut a session's wind-down deadline). So the clock (1)
  never jumps while a worker thread runs (``trio.to_thread`` goes through
  ``trio._threads.start_thread_soon``, a private trio name wrapped here to count threads in
  flight: a thread at work, however long, takes no virtual time), and (2) jumps only after the process has been idle for
  :data:`AUTOJUMP_REAL_SECONDS` of real time, a cushion for a real child process (exiting
  after SIGTERM, being reaped) to be seen before the next virtual deadline (``kill_grace``,
  ``KILL_REAP_TIMEOUT``). Virtual time still runs as fast as the loop is idle: a 10 s
  deadline costs one idle pause, not 10 s. Consequence for tests: a test never races a real
  command against a virtual deadline (no ``timeout`` on a command that should finish).
* :class:`FsyncGate` injects a slow or failing fsync through the storage layer's seam
  (``os.fsync``, the call ``dshd.storage`` makes, as ``tests/durability`` does), for one
  session only (the fd's path names the session). A held fsync blocks its worker thread until
  :meth:`FsyncGate.release` (or :data:`HOLD_REAL_CAP` real seconds, so a broken test ends);
  :meth:`FsyncGate.wait_held` returns once one is held.
* Liveness: every wait on the wire has a generous virtual bound (:data:`LIVENESS`) whose
  message names what was awaited. No test sleeps.

What it shares with ``dshd.server`` instead of copying: each connection is served by
``serve_stream`` (the socket handler minus reading the peer's credentials; the uid is given),
with a ``peer_gone`` check polling one end of a real ``socketpair`` whose other end the test
closes when it closes its side, and a graceful stop is ``stop_gracefully`` then cancelling the
handlers, as ``serve`` does on SIGTERM.
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Callable

import pytest
import trio
import trio._threads
import trio.testing

from dshd.config import Config, ModelConfig
from dshd.execution.sandbox import probe
from dshd.daemon import Daemon
from dshd.server import peer_gone, serve_stream, stop_gracefully, stop_sessions
from dshd.storage.lock import DaemonLock
from dshd.testing import end_hosts
from protocol.apply import apply, is_base
from protocol.codec import Decoder

#: Real seconds the whole process must be idle before the clock jumps (module doc).
AUTOJUMP_REAL_SECONDS = 0.01
#: Virtual seconds any single wait on the wire may take before the test fails (liveness).
LIVENESS = 600.0
#: Real seconds a held fsync waits for its release at most (a broken test still ends).
HOLD_REAL_CAP = 30.0


# --------------------------------------------------------------------------- the clock
class ThreadAwareAutojump:
    """Drives a ``MockClock``'s autojump: off while worker threads run (module doc).

    (``MockClock`` cannot be subclassed; its public ``autojump_threshold`` is switched.)
    """

    def __init__(self, clock: trio.testing.MockClock, idle_real_seconds: float) -> None:
        self.clock = clock
        self._idle = idle_real_seconds
        self._lock = threading.Lock()
        self._threads = 0
        self.threads_seen = 0
        clock.autojump_threshold = idle_real_seconds

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = trio._threads.start_thread_soon

        def start_thread_soon(fn, deliver, name=None):
            token = trio.lowlevel.current_trio_token()  # called in the trio thread
            with self._lock:
                self._threads += 1
                self.threads_seen += 1
            self.clock.autojump_threshold = math.inf

            def delivered(outcome) -> None:  # runs in the worker thread
                try:
                    deliver(outcome)
                finally:
                    with self._lock:
                        self._threads -= 1
                    try:
                        token.run_sync_soon(self._resync)
                    except trio.RunFinishedError:
                        pass

            return real(fn, delivered, name)

        monkeypatch.setattr(trio._threads, "start_thread_soon", start_thread_soon)

    def _resync(self) -> None:
        with self._lock:
            busy = self._threads
        self.clock.autojump_threshold = math.inf if busy else self._idle


@pytest.fixture
def autojump(monkeypatch) -> ThreadAwareAutojump:
    guard = ThreadAwareAutojump(trio.testing.MockClock(), AUTOJUMP_REAL_SECONDS)
    guard.install(monkeypatch)
    return guard


@pytest.fixture
def daemon_clock(autojump) -> trio.testing.MockClock:
    """The clock of every test of this level (module doc); request it in the test."""
    return autojump.clock


# --------------------------------------------------------------------------- fsync faults
class FsyncGate:
    """Hold (slow disk) or fail (EIO) the fsyncs of one session's files (module doc)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._lock = threading.Lock()
        self._target: str | None = None
        self._mode: str | None = None
        self._release = threading.Event()
        self._held_event: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self.held = 0
        self.failed = 0
        real = os.fsync

        def fsync(fd: int) -> None:
            if self._hits(fd):
                with self._lock:
                    mode = self._mode
                if mode == "fail":
                    with self._lock:
                        self.failed += 1
                    raise OSError(errno.EIO, "injected EIO (tests/daemon FsyncGate)")
                if mode == "hold":
                    with self._lock:
                        self.held += 1
                    self._signal_held()
                    self._release.wait(HOLD_REAL_CAP)
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def _hits(self, fd: int) -> bool:
        target = self._target
        if target is None or self._mode is None:
            return False
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return f"/{target}/" in path or path.endswith(f"/{target}")

    def _signal_held(self) -> None:
        event, token = self._held_event, self._token
        if event is not None and token is not None:
            try:
                token.run_sync_soon(event.set)
            except trio.RunFinishedError:
                pass

    def hold(self, session_id: str) -> None:
        """From now on every fsync of this session's files blocks until :meth:`release`."""
        self._token = trio.lowlevel.current_trio_token()
        self._held_event = trio.Event()
        self._release.clear()
        with self._lock:
            self._target, self._mode = session_id, "hold"

    def fail(self, session_id: str) -> None:
        with self._lock:
            self._target, self._mode = session_id, "fail"

    async def wait_held(self) -> None:
        assert self._held_event is not None, "hold() first"
        with trio.fail_after(LIVENESS):
            await self._held_event.wait()

    def release(self) -> None:
        with self._lock:
            self._target, self._mode = None, None
        self._release.set()


# --------------------------------------------------------------------------- the wire
class WireError(Exception):
    """An error response: ``code``, ``message``, ``data``."""

    def __init__(self, error: dict) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code = error.get("code")
        self.message = error.get("message", "")
        self.data = error.get("data")


class Lane:
    """The client's mirror of one subscription: decode each batch, apply it (OPS.md §3)."""

    def __init__(self, subscription_id: str) -> None:
        self.id = subscription_id
        self.value: Any = None
        self.seq: int | None = None
        self.batches = 0
        self._decoder = Decoder()

    def feed(self, seq: int, wire_ops: list) -> None:
        if is_base(wire_ops):
            self._decoder = Decoder()
            self.value = None
        else:
            assert self.seq is not None and seq == self.seq + 1, (self.seq, seq)
        self.value = apply(self.value, self._decoder.decode(wire_ops))
        self.seq = seq
        self.batches += 1

    def tool(self, call_id: str) -> dict | None:
        return (self.value or {}).get("tools", {}).get(call_id)

    def recent(self, call_id: str) -> dict | None:
        for entry in (self.value or {}).get("recent", []):
            if entry.get("callId") == call_id:
                return entry
        return None

    def approval_for(self, call_id: str) -> tuple[str, dict] | None:
        for approval_id, entry in ((self.value or {}).get("approvals") or {}).items():
            if entry.get("callId") == call_id:
                return approval_id, entry
        return None


class Wire:
    """The client end of one connection: lines out, lines in, every message kept in order."""

    def __init__(self, stream: trio.abc.HalfCloseableStream, close_peer: Callable[[], None]) -> None:
        self._stream = stream
        self._close_peer = close_peer
        self.received: list[Any] = []  # every decoded line, in arrival order
        self.lanes: dict[str, Lane] = {}
        self.eof = trio.Event()
        self._changed = trio.Event()
        self._next_id = 0

    # -- reading
    async def read_forever(self) -> None:
        buf = b""
        try:
            while True:
                data = await self._stream.receive_some(65536)
                if not data:
                    break
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self._take(json.loads(line))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.eof.set()
            self._wake()

    def _take(self, message: Any) -> None:
        self.received.append(message)
        if isinstance(message, dict) and message.get("method") == "stream":
            params = message["params"]
            lane = self.lanes.setdefault(params["subscriptionId"], Lane(params["subscriptionId"]))
            lane.feed(params["seq"], params["ops"])
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[], Any], what: str) -> Any:
        """Wait until ``predicate()`` is truthy; returns it. It is re-checked on every line this
        wire reads, so it must be about what the wire shows: for daemon-side progress that
        sends no line, ``await trio.testing.wait_all_tasks_blocked()`` first, then ask."""
        with trio.move_on_after(LIVENESS):
            while True:
                value = predicate()
                if value:
                    return value
                if self.eof.is_set():
                    raise AssertionError(f"the connection ended while waiting for {what}")
                await self._changed.wait()
        raise AssertionError(f"no {what} within {LIVENESS:g} virtual seconds")

    def answer(self, request_id: Any) -> dict | None:
        """The response object (or batch element) that answers ``request_id``, if read."""
        for message in self.received:
            for item in message if isinstance(message, list) else [message]:
                if isinstance(item, dict) and "method" not in item and item.get("id") == request_id:
                    return item
        return None

    # -- writing
    async def send_raw(self, data: bytes) -> None:
        await self._stream.send_all(data)

    async def send(self, message: Any) -> None:
        await self.send_raw(json.dumps(message).encode() + b"\n")

    def request_object(self, method: str, params: dict | None = None) -> dict:
        self._next_id += 1
        message = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            message["params"] = params
        return message

    async def request(self, method: str, params: dict | None = None) -> dict:
        """Send one request; return its response object (result or error)."""
        message = self.request_object(method, params)
        await self.send(message)
        return await self.wait_for(lambda: self.answer(message["id"]), f"the answer to {method}")

    async def call(self, method: str, params: dict | None = None) -> Any:
        """Send one request; return its result, raise :class:`WireError` for an error."""
        response = await self.request(method, params)
        if "error" in response:
            raise WireError(response["error"])
        return response["result"]

    async def error(self, method: str, params: dict | None = None) -> WireError:
        response = await self.request(method, params)
        assert "error" in response, f"{method} answered {response!r}, expected an error"
        return WireError(response["error"])

    async def half_close(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        """Close both directions (the daemon sees POLLHUP)."""
        self._close_peer()
        await self._stream.aclose()

    # -- the lane
    async def subscribe(self, session_id: str) -> Lane:
        result = await self.call("subscribe", {"sessionId": session_id})
        sub = result["subscriptionId"]
        await self.wait_for(lambda: sub in self.lanes, f"the base batch of {sub}")
        return self.lanes[sub]

    async def wait_lane(self, lane: Lane, predicate: Callable[[Lane], Any], what: str) -> Any:
        return await self.wait_for(lambda: lane.value is not None and predicate(lane), what)

    # -- tool calls
    async def run(self, session_id: str, command: str, *, approved: bool = True,
                  call_id: str | None = None) -> str:
        params: dict = {"sessionId": session_id, "name": "bash",
                        "arguments": {"command": command}, "approved": approved}
        if call_id is not None:
            params["callId"] = call_id
        return (await self.call("tool.run", params))["callId"]

    async def wait(self, session_id: str, call_id: str, timeout: float | None = None) -> dict:
        params: dict = {"sessionId": session_id, "callId": call_id}
        if timeout is not None:
            params["timeout"] = timeout
        return await self.call("tool.wait", params)


# --------------------------------------------------------------------------- the daemon
class DaemonUnderTest:
    """A real ``Daemon`` with its registry in a nursery; connections over memory streams."""

    def __init__(self, root: Path, config: Config, clock: trio.testing.MockClock) -> None:
        self.root = root
        self.config = config
        self.clock = clock
        self.state_dir = config.state_path()
        self.workdir = root / "work"
        self.workdir.mkdir(exist_ok=True)
        self.daemon: Daemon | None = None
        self.stopped = trio.Event()
        self._handlers: trio.Nursery | None = None
        self._outer: trio.Nursery | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """What ``serve`` does around the accept loop (module doc), until :meth:`stop`."""
        assert trio.lowlevel.current_clock() is self.clock, (
            "request the daemon_clock fixture in the test so pytest-trio runs on it"
        )
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = DaemonLock(self.state_dir)
        lock.acquire()
        try:
            sandbox = await probe(self.config.sandbox_provider,
                                  scratch_dir=self.state_dir / "sandbox")
            self.daemon = Daemon(self.config, self.state_dir, sandbox, lock)
            async with trio.open_nursery() as outer:
                self._outer = outer
                await outer.start(self.daemon.registry.run)
                await self.daemon.registry.resume_unsettled()  # as serve does before accepting
                async with trio.open_nursery() as handlers:
                    self._handlers = handlers
                    task_status.started(self)
                    await trio.sleep_forever()
        finally:
            lock.release()
            # Call hosts outlive a daemon that detaches on stop: end every one it left.
            end_hosts(self.state_dir)
            self.stopped.set()

    async def stop_sessions(self) -> None:
        """The sessions' share of a graceful stop alone (``dshd.server.stop_sessions``):
        what a test checks before :meth:`stop` ends the call hosts a detaching stop left."""
        assert self.daemon is not None
        await stop_sessions(self.daemon)

    async def stop(self) -> None:
        """Graceful stop as ``serve`` does it on SIGTERM (module doc); then every call host
        a detaching stop left is ended (``dshd.testing.end_hosts``)."""
        assert self.daemon is not None and self._handlers and self._outer
        await stop_gracefully(self.daemon)
        self._handlers.cancel_scope.cancel()
        self._outer.cancel_scope.cancel()
        with trio.fail_after(LIVENESS):
            await self.stopped.wait()

    async def connect(self, *, initialize: bool = True, approvals: bool = False,
                      uid: int | None = None, nursery: trio.Nursery) -> Wire:
        """A new connection served by a real ``Connection``; ``nursery`` runs the reader."""
        assert self.daemon is not None and self._handlers is not None
        client_end, daemon_end = trio.testing.memory_stream_pair()
        ours, theirs = socket.socketpair()
        uid = os.getuid() if uid is None else uid
        daemon = self.daemon

        async def serve_one() -> None:
            try:
                await serve_stream(daemon, daemon_end, uid, peer_gone=lambda: peer_gone(theirs))
            finally:
                theirs.close()

        self._handlers.start_soon(serve_one)
        wire = Wire(client_end, ours.close)
        nursery.start_soon(wire.read_forever)
        if initialize:
            params: dict = {"protocolVersion": 1, "client": {"name": "tests/daemon"}}
            if approvals:
                params["capabilities"] = {"approvals": True}
            await wire.call("initialize", params)
        return wire

    async def create_session(self, wire: Wire, **params) -> str:
        params.setdefault("cwd", str(self.workdir))
        params.setdefault("sandbox", "danger-full-access")
        return (await wire.call("session.create", params))["sessionId"]


def make_config(root: Path, script: Path | None = None, **overrides) -> Config:
    values: dict = dict(
        socket=str(root / "run" / "dshd.sock"),
        state_dir=str(root / "state"),
        sandbox_provider="none",
        sandbox="danger-full-access",
        log_level="warning",
        # Not about idle closing: a session must not close between two requests of a test.
        session_idle_seconds=365 * 86400.0,
        model=ModelConfig(provider="scripted", script=str(script) if script else None,
                          max_steps=4),
    )
    values.update(overrides)
    return Config(**values)


@pytest.fixture
def model_script() -> list[dict] | None:
    """Override (or parametrize) to give the scripted model its responses (JSONL lines)."""
    return None


@pytest.fixture
def daemon_overrides() -> dict:
    """Override to change Config fields of the daemon under test."""
    return {}


@asynccontextmanager
async def running_daemon(root: Path, config: Config, clock: trio.testing.MockClock):
    async with trio.open_nursery() as nursery:
        dut = await nursery.start(DaemonUnderTest(root, config, clock).run)
        try:
            yield dut
        finally:
            if not dut.stopped.is_set():
                await dut.stop()


@pytest.fixture
async def daemon(tmp_path, daemon_clock, model_script, daemon_overrides):
    """A running :class:`DaemonUnderTest` (stopped gracefully at teardown)."""
    script = None
    if model_script is not None:
        script = tmp_path / "script.jsonl"
        script.write_text("".join(json.dumps(line) + "\n" for line in model_script))
    config = make_config(tmp_path, script, **daemon_overrides)
    async with running_daemon(tmp_path, config, daemon_clock) as dut:
        yield dut


@pytest.fixture
def fsync_gate(monkeypatch) -> FsyncGate:
    return FsyncGate(monkeypatch)
