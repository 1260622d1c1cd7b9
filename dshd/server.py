"""The daemon: listen, admit peers, serve connections, stop within one budget (PROTOCOL.md §1, §3.6).

Theory of operation: :func:`serve` takes the state directory (its lock), probes the sandbox,
builds the one :class:`~dshd.daemon.Daemon` every connection shares and opens the listening
socket (:func:`_listener`: under socket activation, ``LISTEN_FDS``, the passed socket as is;
otherwise one the daemon binds). :func:`_run` then runs, in one nursery, the session registry
(which owns the sessions and their tool calls), the service monitor (``dshd.service``: watchdog
pings, ``STATUS=``, reload) and ``trio.serve_listeners`` with a handler nursery of its own, so
that a graceful stop can stop accepting first, then tell the sessions to apply ``on_stop`` to
their calls (``detach``: the call hosts run on; ``cancel``: the calls settle) and flush, and
then cancel the handlers. Before the first accept, the registry opens every session with a
call that has not settled (``SessionRegistry.resume_unsettled``, HOST.md §7), so calls that
outlived the previous daemon are running (or settled) again before any client asks; then the
retention task starts (``dshd.sessions.retention.run``: a pass now, then every interval).

Each accepted connection runs :func:`_serve_socket`, the handler wrapper: it reads the peer's
credentials off the socket (a process inside one of this daemon's sandboxes counts as a foreign
uid) and hands the stream to :func:`serve_stream`, which works over any half-closeable stream:
past ``max_connections`` it answers one ``-32013`` line and closes (at most ``MAX_REFUSING`` such
refusals at once; past that, a close without the line); a peer uid that may not connect gets one
``-32001`` line; anything else is a :class:`~dshd.connection.Connection`, whose failure is logged
and stays in it. Accepting out of file descriptors (or memory): ``trio.serve_listeners`` backs
off and retries; :class:`_Listening` logs one line per episode instead of trio's one per retry.

The stop: SIGTERM or SIGINT starts it; SIGHUP reloads the config between stops. One deadline,
``stop_timeout_seconds`` from the signal (``dshd.daemon.StopBudget``), bounds it: the sessions get
their share (``registry.aclose(deadline, on_stop)``), then the handlers are cancelled and each
connection's close runs shielded within its share. ``EXTEND_TIMEOUT_USEC=`` with ``STOPPING=1``
tells systemd the same budget plus the margin.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import socket as stdsocket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import structlog
import trio

from protocol import rpc

from .config import Config
from .connection import Connection, refuse
from .daemon import Daemon
from .execution.peers import refuse_confined
from .handlers import dispatch
from .service import Notifier, ServiceMonitor, stopping_message, watchdog_interval
from .sessions import retention
from .storage.lock import DaemonLock

log = structlog.get_logger("dshd")

SD_LISTEN_FDS_START = 3
#: Connections being refused at once (max_connections reached): each gets its error line and a
#: bounded drain; past this many, a new one is closed at once without the line.
MAX_REFUSING = 64
ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


class StartupError(Exception):
    """dshd cannot start; the message says why and what to do."""


def peer_uid(sock: trio.socket.SocketType) -> int | None:
    """The connecting process's uid via SO_PEERCRED (Linux), or None where unavailable."""
    try:
        creds = sock.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def peer_gone(sock: trio.socket.SocketType) -> bool:
    """True when the peer closed its socket (POLLHUP: both directions shut), not only its
    writing half."""
    import select

    poller = select.poll()
    poller.register(sock.fileno(), select.POLLHUP)
    return any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in poller.poll(0))


def _activated_socket() -> stdsocket.socket | None:
    """The first socket passed by systemd socket activation, or None."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    if count < 1:
        return None
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    try:
        sock = stdsocket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as exc:
        raise StartupError(
            f"socket activation passed fd {SD_LISTEN_FDS_START}, but it is not a socket "
            f"({exc.strerror}); check the .socket unit"
        ) from None
    if sock.family != stdsocket.AF_UNIX or sock.type != stdsocket.SOCK_STREAM:
        raise StartupError("socket activation passed a socket that is not a Unix stream socket; "
                           "use ListenStream=/path in the .socket unit")
    sock.setblocking(False)
    return sock


def _bind_socket(path: Path, system: bool, group: str) -> stdsocket.socket:
    """Create the socket directory (0700 user / 0750 system) and bind a 0600/0660 socket."""
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True, mode=0o750 if system else 0o700)
    st = parent.stat()
    if st.st_uid != os.getuid():
        raise StartupError(f"socket directory {parent} belongs to uid {st.st_uid}, not to us")
    os.chmod(parent, 0o750 if system else 0o700)
    if path.exists() or path.is_symlink():
        other = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
        try:
            other.connect(str(path))
        except OSError:
            path.unlink()  # stale socket of a daemon that died
        else:
            raise StartupError(
                f"another dshd is already listening on {path}; stop it first "
                "(`systemctl --user stop dshd`, or kill the process)"
            )
        finally:
            other.close()
    sock = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM | stdsocket.SOCK_CLOEXEC)
    old = os.umask(0o177 if not system else 0o117)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    if system:
        import grp

        try:
            gid = grp.getgrnam(group).gr_gid
            os.chown(parent, -1, gid)  # members must traverse the 0750 directory too
            os.chown(path, -1, gid)
        except (KeyError, PermissionError):
            log.warning("socket.group_missing", group=group)
        os.chmod(path, 0o660)
    else:
        os.chmod(path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock


class _Listening(trio.abc.Listener[trio.SocketStream]):
    """The daemon's listener as ``trio.serve_listeners`` sees it. ``accept`` logs its resource
    errors once per episode, and the recovery (serve_listeners backs off and retries).
    ``aclose`` leaves the socket open: serve_listeners closes its listeners when the stop
    cancels it, but the socket stays until the stop is done (:meth:`close`, by ``_listener``),
    so a client that connects meanwhile waits in the backlog as before."""

    def __init__(self, inner: trio.SocketListener) -> None:
        self.inner = inner
        self.starved = 0

    async def accept(self) -> trio.SocketStream:
        try:
            stream = await self.inner.accept()
        except OSError as exc:
            if exc.errno in ACCEPT_CAPACITY_ERRNOS:
                if not self.starved:
                    log.error("accept.out_of_resources", error=exc.strerror,
                              hint="raise LimitNOFILE= or close idle clients")
                self.starved += 1
            raise
        if self.starved:
            log.info("accept.recovered", retries=self.starved)
            self.starved = 0
        return stream

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        await self.inner.aclose()


async def serve(config: Config, *, reload_config: Callable[[], Config] | None = None,
                task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the daemon until SIGTERM/SIGINT; then stop gracefully within
    ``stop_timeout_seconds``. SIGHUP reloads the config through ``reload_config``
    (``dshd.service.ServiceMonitor.reload``).

    Raises StartupError (with a sentence a person can act on) when it cannot start.
    """
    from .execution.sandbox import probe

    nofile, _ = raise_fd_limit()
    state_dir = config.state_path()
    daemon_lock = _lock_state_dir(state_dir)
    try:
        sandbox = await probe(config.sandbox_provider, scratch_dir=state_dir / "sandbox",
                              tmp_size_bytes=config.tmp_size_bytes,
                              tmp_total_bytes=None if config.system else config.tmp_total_bytes)
        log.info("sandbox.probed", **sandbox.describe())
        daemon = Daemon(config, state_dir, sandbox, daemon_lock)
        async with _listener(config) as (listener, path):
            ready = dict(socket=str(path), state_dir=str(state_dir), pid=daemon.pid,
                         max_open_files=nofile, sandbox=sandbox.describe())
            await _run(daemon, listener, ready, reload_config, task_status)
    finally:
        daemon_lock.release()
    log.info("dshd.stopped")


def _lock_state_dir(state_dir: Path) -> DaemonLock:
    """Create the state directory and take its daemon lock (one dshd per state directory)."""
    from .storage.errors import LockHeld

    daemon_lock = DaemonLock(state_dir)
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        daemon_lock.acquire()
    except LockHeld as exc:
        raise StartupError(f"{exc}; only one dshd may use a state directory") from None
    except OSError as exc:
        raise StartupError(
            f"cannot use the state directory {state_dir}: {exc.strerror or exc}; "
            "pass --state-dir (or DSH_STATE_DIR) with a writable directory"
        ) from None
    return daemon_lock


@asynccontextmanager
async def _listener(config: Config) -> AsyncIterator[tuple[_Listening, Path]]:
    """The listening socket (passed by systemd, else bound here) and its path; closed (and a
    bound one unlinked) on the way out."""
    sock = _activated_socket()
    path = config.socket_path()
    if sock is None:
        try:
            sock = _bind_socket(path, config.system, config.group)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise StartupError(f"cannot create the socket {path}: {exc.strerror}") from None
            raise
        own_socket = True
    else:
        own_socket = False
        name = sock.getsockname()  # bytes for an abstract address
        path = Path(name if isinstance(name, str) and name else "(abstract or unnamed socket)")
    listener = _Listening(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
    try:
        yield listener, path
    finally:
        await listener.close()
        if own_socket:
            try:
                path.unlink()
            except FileNotFoundError:
                pass


async def _run(daemon: Daemon, listener: _Listening, ready: dict,
               reload_config: Callable[[], Config] | None, task_status) -> None:
    """Registry, service monitor and the listener in one nursery, until a stop signal."""
    # Out of fds, trio logs one error (with a traceback) per 100 ms retry; _Listening logs
    # the episode once instead.
    logging.getLogger("trio.serve_listeners").setLevel(logging.CRITICAL)
    notifier = Notifier.from_environ()
    monitor = ServiceMonitor(daemon, notifier, reload_config=reload_config,
                             watchdog=watchdog_interval())
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as outer:
                await outer.start(daemon.registry.run)
                # Calls that outlived the last daemon come back before anyone can ask.
                await daemon.registry.resume_unsettled()
                outer.start_soon(retention.run, daemon.registry, daemon.config)
                await outer.start(monitor.run)
                async with trio.open_nursery() as handlers:
                    accepting = trio.CancelScope()
                    handlers.start_soon(_accept, daemon, listener, handlers, accepting)
                    log.info("dshd.ready", **ready, watchdog_seconds=monitor.watchdog)
                    notifier.send(f"READY=1\nSTATUS={monitor.status_line()}")
                    task_status.started(daemon)
                    await _until_stop(signals, monitor)
                    await _stop(daemon, notifier, accepting)
                    handlers.cancel_scope.cancel()
                outer.cancel_scope.cancel()
    finally:
        notifier.close()


async def _accept(daemon: Daemon, listener: _Listening, handlers: trio.Nursery,
                  scope: trio.CancelScope) -> None:
    """``trio.serve_listeners`` under ``scope`` (the stop cancels it); the handlers run in
    ``handlers``."""
    with scope:
        await trio.serve_listeners(functools.partial(_serve_socket, daemon), [listener],
                                   handler_nursery=handlers)


async def _until_stop(signals, monitor: ServiceMonitor) -> None:
    """Wait for SIGTERM or SIGINT; a SIGHUP on the way reloads the config."""
    async for signum in signals:
        if signum == signal.SIGHUP:
            await monitor.reload()
            continue
        log.info("dshd.stopping", signal=signal.Signals(signum).name)
        return


async def _stop(daemon: Daemon, notifier: Notifier, accepting: trio.CancelScope) -> None:
    """The graceful stop, within ``stop_timeout_seconds``: stop accepting, then the sessions
    settle their calls (TOOL_CANCELLED) and flush within their share of it, the connections
    send their answers in flight; the caller then cancels the handlers; each connection's
    close is bounded by its own share."""
    notifier.send(stopping_message(daemon.stop_budget))
    accepting.cancel()
    await stop_gracefully(daemon)


async def stop_gracefully(daemon: Daemon) -> None:
    """Stop the sessions (:func:`stop_sessions`), then let every connection send its answers
    in flight (the ``tool.wait``s the stop settled) by ``stop_budget.answers`` from the start."""
    answers_by = trio.current_time() + daemon.stop_budget.answers
    await stop_sessions(daemon)
    await daemon.finish_connections(answers_by)


async def stop_sessions(daemon: Daemon) -> None:
    """The sessions' share of a graceful stop: every session applies ``on_stop`` to its calls
    (``detach``: their hosts run on for the next daemon; ``cancel``: they settle
    TOOL_CANCELLED), ends its turn and flushes, by ``stop_budget.sessions`` from now."""
    deadline = trio.current_time() + daemon.stop_budget.sessions
    with trio.CancelScope(deadline=deadline):
        await daemon.registry.aclose(deadline=deadline, policy=daemon.config.on_stop)


async def _serve_socket(daemon: Daemon, stream: trio.SocketStream) -> None:
    """The handler of one accepted socket: the peer's uid (a confined process counts as a
    foreign one) and the POLLHUP check, then :func:`serve_stream`."""
    sock = stream.socket
    uid = None if refuse_confined(sock, daemon.sandbox, log) else peer_uid(sock)
    await serve_stream(daemon, stream, uid, peer_gone=lambda: peer_gone(sock))


async def serve_stream(daemon: Daemon, stream: trio.abc.HalfCloseableStream, uid: int | None,
                       *, peer_gone: Callable[[], bool] | None = None) -> None:
    """Serve one connection over any half-closeable stream for the peer ``uid``: refused past
    ``max_connections`` (-32013) or for a uid that may not connect (-32001), else a
    :class:`Connection` until it ends. Whatever goes wrong in it stays in it: logged."""
    if daemon.slots_used() >= daemon.config.max_connections:
        await _refuse_over_limit(daemon, stream)
        return
    if not daemon.peer_allowed(uid):
        await _refuse_peer(daemon, stream, uid)
        return
    conn = Connection(daemon, stream, uid, dispatch, peer_gone=peer_gone)
    daemon.connections.add(conn)
    try:
        await conn.run()
    except Exception:
        log.exception("connection.crashed", conn=conn.id)
    finally:
        daemon.forget(conn)


async def _refuse_over_limit(daemon: Daemon, stream: trio.abc.HalfCloseableStream) -> None:
    """``max_connections`` are served: this one gets one -32013 line (bounded) and is closed."""
    limit = daemon.config.max_connections
    if daemon.refusing >= MAX_REFUSING:
        await stream.aclose()
        return
    daemon.refusing += 1
    try:
        log.warning("connection.refused", reason="max_connections reached", max_connections=limit)
        await refuse(stream, rpc.encode_error(
            None, rpc.LIMIT_EXCEEDED,
            f"limit exceeded: dshd serves at most {limit} connections at once (max_connections); "
            "close idle clients and retry",
        ), daemon.stop_budget)
    finally:
        daemon.refusing -= 1


async def _refuse_peer(daemon: Daemon, stream: trio.abc.HalfCloseableStream,
                       uid: int | None) -> None:
    """A peer uid that may not connect: one -32001 line (bounded), closed. It holds a
    ``max_connections`` slot meanwhile, as a served connection would."""
    daemon.refusing_peers += 1
    try:
        log.warning("connection.refused", reason="peer uid not allowed", uid=uid)
        await refuse(stream, rpc.encode_error(
            None, rpc.PERMISSION_DENIED,
            "permission denied: this daemon serves its own user "
            "(and, in system mode, the configured group)",
        ), daemon.stop_budget)
    finally:
        daemon.refusing_peers -= 1


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (each session holds fds); returns both."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft, hard
