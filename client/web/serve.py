"""``dsh web``'s server: hypercorn on trio serving the bridge app (docs/WEB.md).

Theory of operation: :func:`serve` checks the listen address (a host beyond loopback needs
``allow_remote``; :class:`RemoteRefused` carries the SSH-tunnel sentence), loads or makes the
token (``client.web.auth.load_token``), binds the listening socket itself (port 0 picks a free
one, so the real port is known before the app is built: the cookie's name uses it; for
``localhost`` one socket per loopback address, 127.0.0.1 and ::1, on one port, so nobody can
squat the one a browser tries first; the URL then names 127.0.0.1; a taken address is
:class:`AddressInUse` with what to do) and hands the sockets to hypercorn as ``fd://N``. hypercorn runs on the caller's trio loop
(``hypercorn.trio.serve``) with its access log off (the token travels in a query string) and
``websocket_max_message_size`` 16 MiB; it stops gracefully when its shutdown trigger returns,
which happens at the first SIGTERM or SIGINT (the receiver is opened before listening, so no
signal is lost between the two); open WebSockets are closed ``1001`` first. ``task_status.started`` gets the tokened URL once the socket
listens; the CLI prints it. Only this function knows the token; logs never see it.
"""

from __future__ import annotations

import errno
import logging
import signal
import socket as _socket
from functools import partial
from pathlib import Path

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from client.paths import socket_path
from client.web.auth import AuthRules, default_token_file, host_port, is_loopback, load_token
from client.web.bridge import MAX_CLIENTS, MAX_MESSAGE_BYTES, build_app

__all__ = ["DEFAULT_LISTEN", "AddressInUse", "ListenError", "RemoteRefused", "parse_listen", "serve"]

DEFAULT_LISTEN = "127.0.0.1:8470"
_GRACE_S = 2.0  # open WebSockets get this long to end at shutdown
_PORT_TRIES = 20  # port 0 on localhost: free on 127.0.0.1 but taken on ::1 -> another one


class ListenError(ValueError):
    """``--listen`` is not ``HOST:PORT``."""


class RemoteRefused(Exception):
    """A host beyond loopback without ``--allow-remote``; the message says how to tunnel."""


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port); port 0 = pick a free one."""
    host, sep, port_text = listen.rpartition(":")
    host = host.strip().lower()  # a host name in any case (LOCALHOST is localhost)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ListenError(f"--listen {listen!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host, int(port_text)


def tunnel_sentence(host: str, port: int) -> str:
    port = port or 8470
    return (f"dsh web: refusing to listen on {host} (beyond loopback): anyone who reaches it could "
            f"try the token. Tunnel over SSH instead: run `dsh web --listen 127.0.0.1:{port}` on "
            f"the host, then `ssh -L {port}:127.0.0.1:{port} HOST` on your machine and open the "
            "URL dsh web printed; or pass --allow-remote.")


class AddressInUse(OSError):
    """The listen address is taken; the message says what to do."""


def _bind_one(host: str, port: int) -> _socket.socket:
    infos = _socket.getaddrinfo(host, port, type=_socket.SOCK_STREAM, flags=_socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = _socket.socket(family, kind, proto)
    try:
        sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        if family == _socket.AF_INET6:
            sock.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(exc.errno, _in_use(host, port)) from None
        raise
    return sock


def _in_use(host: str, port: int) -> str:
    return (f"{host_port(host, port)} is in use (another dsh web?): pick another with "
            "--listen 127.0.0.1:PORT, or port 0 for any free one")


def _bind(host: str, port: int) -> list[_socket.socket]:
    """The listening sockets: one, or for ``localhost`` one per loopback address (127.0.0.1
    and ::1 where the kernel has it: a browser may try either first, and a squatter on the
    other would receive the token). All on one port; any taken -> :class:`AddressInUse`."""
    if host != "localhost":
        return [_bind_one(host, port)]
    for _ in range(_PORT_TRIES if port == 0 else 1):
        first = _bind_one("127.0.0.1", port)
        chosen = first.getsockname()[1]
        try:
            return [first, _bind_one("::1", chosen)]
        except AddressInUse:
            first.close()
            if port:
                raise
        except OSError as exc:
            if exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                first.close()
                raise
            return [first]  # no IPv6 loopback here: nobody can squat it either
    raise AddressInUse(errno.EADDRINUSE, _in_use("localhost", port))


def _config(fds: list[int]) -> Config:
    config = Config()
    config.bind = [f"fd://{fd}" for fd in fds]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.websocket_max_message_size = MAX_MESSAGE_BYTES
    config.graceful_timeout = _GRACE_S
    config.include_server_header = False
    return config


async def _first_signal(signals: trio.abc.ReceiveChannel, stopping: trio.Event) -> None:
    """hypercorn's shutdown trigger: the first SIGTERM/SIGINT; open relays close first."""
    async for signum in signals:
        logging.getLogger("dsh.web").info("stopping (%s)", signal.Signals(signum).name)
        stopping.set()
        return


async def serve(listen: str, *, socket: Path | None, token_file: Path | None, new_token: bool,
                allow_remote: bool, max_clients: int = MAX_CLIENTS,
                task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the bridge until SIGTERM/SIGINT (module doc); ``started`` gets the URL."""
    host, port = parse_listen(listen)
    if not is_loopback(host) and not allow_remote:
        raise RemoteRefused(tunnel_sentence(host, port))
    token = load_token(token_file or default_token_file(), new=new_token)
    socks = _bind(host, port)
    port = socks[0].getsockname()[1]
    rules = AuthRules(token=token, port=port, listen_host=host)
    stopping = trio.Event()
    app = build_app(rules, socket_path(socket), stopping, max_clients=max_clients)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "localhost") else host
    url = f"http://{host_port(shown, port)}/?token={token}"
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(hypercorn_serve, app, _config([s.detach() for s in socks]),
                                        shutdown_trigger=partial(_first_signal, signals, stopping)))
            logging.getLogger("dsh.web").info("listening on %s", host_port(host, port))
            task_status.started(url)
