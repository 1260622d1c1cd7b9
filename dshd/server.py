"""The daemon: listen, check peers, accept, shut down (PROTOCOL.md §1, §3.6).

Theory of operation: :func:`serve` builds every long-lived object once (config, daemon lock,
sandbox verdict, session registry) and runs them in one nursery: the registry (which owns the
sessions and their tool calls), the accept loop and the signal watcher. Each accepted
connection is a task in a separate handler nursery (the accept loop never waits for one) so
that a graceful stop can stop accepting first, then tell the sessions to settle their calls and
flush, then put a deadline on the handlers. Under socket activation (``LISTEN_FDS``) the passed
socket is used as is; otherwise the daemon binds its own. Bounds shared by all connections live
on :class:`Daemon`: at most ``max_connections`` are served (the next one is answered -32013 and
closed), their unfinished lines share one ``LineBudget``, and long lines are parsed on at most
``PARSE_THREADS`` worker threads. Talking to systemd is ``dshd.service``'s job: ``READY=1`` once
the socket listens, watchdog pings and ``STATUS=`` lines from its monitor task, and SIGHUP (a
config reload: RELOADING=1 … READY=1) handled by the signal watcher between graceful stops.
"""

from __future__ import annotations

import errno
import os
import signal
import socket as stdsocket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import structlog
import trio

from protocol import rpc

from . import __version__
from .config import Config
from .connection import PARSE_THREADS, Connection, LineBudget, refuse
from .service import Notifier, ServiceMonitor, watchdog_interval
from .execution.peers import refuse_confined
from .sessions.registry import SessionRegistry
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


def _group_members(group: str) -> set[int]:
    import grp
    import pwd

    try:
        g = grp.getgrnam(group)
    except KeyError:
        return set()
    uids = set()
    for name in g.gr_mem:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    for p in pwd.getpwall():
        if p.pw_gid == g.gr_gid:
            uids.add(p.pw_uid)
    return uids


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


class Daemon:
    """Everything the connection handlers share; built once, passed down."""

    def __init__(self, config: Config, state_dir: Path, sandbox, daemon_lock=None) -> None:
        self.config = config
        self.state_dir = state_dir
        self.sandbox = sandbox
        self.registry = SessionRegistry(config, state_dir, sandbox, daemon_lock)
        self.connections: set[Connection] = set()
        self.refusing = 0  # connections being refused for max_connections (MAX_REFUSING)
        self.line_budget = LineBudget(config.max_buffered_bytes)
        self.parse_limiter = trio.CapacityLimiter(PARSE_THREADS)
        self.started_at = time.time_ns() // 1_000_000
        self.pid = os.getpid()
        self.stopping = False
        self._allowed_uids = {os.getuid(), 0}
        if config.system:
            self._allowed_uids |= _group_members(config.group)
        self._next_sub = 0

    def peer_allowed(self, uid: int | None) -> bool:
        return uid is not None and uid in self._allowed_uids

    def mint_subscription_id(self) -> str:
        self._next_sub += 1
        return f"sub-{self._next_sub}"

    def status(self) -> dict:
        return {
            "version": __version__,
            "pid": self.pid,
            "startedAt": self.started_at,
            "sessionsOpen": len(self.registry.open_sessions()),
            "connections": len(self.connections),
            "subscriptions": sum(len(c.subscriptions) for c in self.connections),
            # Stream batches dropped for slow readers (each later replaced by a base batch).
            "droppedBatches": sum(
                sub.dropped_batches for c in self.connections for sub in c.subscriptions.values()
            ),
            "sandbox": self.sandbox.describe(),
            "stateDir": str(self.state_dir),
        }


async def serve(config: Config, *, reload_config: Callable[[], Config] | None = None,
                task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the daemon until SIGTERM/SIGINT; then stop gracefully (bounded by 10 s). SIGHUP
    reloads the config through ``reload_config`` (``dshd.service.ServiceMonitor.reload``).

    Raises StartupError (with a sentence a person can act on) when it cannot start.
    """
    from .execution.sandbox import probe
    from .storage.errors import LockHeld

    nofile, _ = raise_fd_limit()
    state_dir = config.state_path()
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
    try:
        sandbox = await probe(config.sandbox_provider, scratch_dir=state_dir / "sandbox",
                              tmp_size_bytes=config.tmp_size_bytes,
                              tmp_total_bytes=None if config.system else config.tmp_total_bytes)
        log.info("sandbox.probed", **sandbox.describe())
        daemon = Daemon(config, state_dir, sandbox, daemon_lock)
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
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        notifier = Notifier.from_environ()
        monitor = ServiceMonitor(daemon, notifier, reload_config=reload_config,
                                 watchdog=watchdog_interval())
        try:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                async with trio.open_nursery() as outer:
                    await outer.start(daemon.registry.run)
                    await outer.start(monitor.run)
                    async with trio.open_nursery() as handlers:
                        accept_scope = trio.CancelScope()

                        async def accept_loop() -> None:
                            with accept_scope:
                                await _accept_forever(listener, handlers, daemon)

                        handlers.start_soon(accept_loop)
                        log.info(
                            "dshd.ready",
                            socket=str(path),
                            state_dir=str(state_dir),
                            pid=daemon.pid,
                            max_open_files=nofile,
                            sandbox=sandbox.describe(),
                            watchdog_seconds=monitor.watchdog,
                        )
                        notifier.send(f"READY=1\nSTATUS={monitor.status_line()}")
                        task_status.started(daemon)
                        async for signum in signals:
                            if signum == signal.SIGHUP:
                                await monitor.reload()
                                continue
                            log.info("dshd.stopping", signal=signal.Signals(signum).name)
                            break
                        # Graceful stop: stop accepting; sessions settle their calls
                        # (TOOL_CANCELLED) and flush; then the handlers get a deadline.
                        daemon.stopping = True
                        notifier.send("STOPPING=1")
                        accept_scope.cancel()
                        with trio.move_on_after(8):
                            await daemon.registry.aclose()
                        handlers.cancel_scope.cancel()
                    outer.cancel_scope.cancel()
        finally:
            notifier.close()
            await listener.aclose()
            if own_socket:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
    finally:
        daemon_lock.release()
    log.info("dshd.stopped")


async def _refuse_over_limit(daemon: Daemon, stream: trio.SocketStream) -> None:
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
        ))
    finally:
        daemon.refusing -= 1


async def _handle(daemon: Daemon, stream: trio.SocketStream) -> None:
    """One connection. Whatever goes wrong in it stays in it: logged, never fatal."""
    if len(daemon.connections) >= daemon.config.max_connections:
        await _refuse_over_limit(daemon, stream)
        return
    # A process inside one of this daemon's sandboxes is refused like a foreign uid (-32001).
    uid = None if refuse_confined(stream.socket, daemon.sandbox, log) else peer_uid(stream.socket)
    conn = Connection(daemon, stream, uid)
    daemon.connections.add(conn)
    try:
        await conn.run()
    except Exception:
        log.exception("connection.crashed", conn=conn.id)
    finally:
        daemon.connections.discard(conn)


async def _accept_forever(listener: trio.SocketListener, handlers: trio.Nursery, daemon: Daemon) -> None:
    """Accept connections; out of file descriptors (or memory) → log, back off, go on."""
    starved = 0
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno in ACCEPT_CAPACITY_ERRNOS:
                if not starved:  # one line per episode, not one per retry
                    log.error("accept.out_of_resources", error=exc.strerror,
                              hint="raise LimitNOFILE= or close idle clients")
                starved += 1
                await trio.sleep(0.1)
                continue
            raise
        if starved:
            log.info("accept.recovered", retries=starved)
            starved = 0
        handlers.start_soon(_handle, daemon, stream)


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
