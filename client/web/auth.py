"""The bridge's security rules (docs/WEB.md): the token file, the cookie, Host and Origin.

Theory of operation: the security model is Jupyter's. A random token
(``secrets.token_urlsafe(32)``) lives in a file only its owner can read (0600 in a 0700
directory; default ``$XDG_RUNTIME_DIR/dsh/web-token``, else ``/tmp/dsh-$UID/web-token``) and is
reused by the next ``dsh web``, so a restarted bridge accepts the cookie a page already holds;
``--new-token`` writes a fresh one and every old cookie stops working. The person opens the URL
with ``?token=``; the bridge answers with an HttpOnly, SameSite=Strict cookie whose value is
derived from the token (HMAC-SHA256, so the cookie is not the token) and named after the port
(``dsh-web-PORT``: two bridges on one host do not overwrite each other's cookie). Every
comparison is constant-time (``hmac.compare_digest``).

The cookie alone does not open the WebSocket: a cookie is sent to every port of a host, so a
server another local user runs on another loopback port could read it. The WebSocket also
needs the token itself, offered as the subprotocol ``dsh.token.<token>`` next to ``dsh.v1``:
the token exchange hands it to the page in the URL fragment (which never reaches a server or a
Referer), and the page keeps it in ``localStorage``, which is per origin (scheme, host AND port).

Against DNS rebinding a request's ``Host`` must be the listen address or a loopback name
(``localhost``, ``127.0.0.1``, ``[::1]``) with any port (an SSH tunnel may forward another
local port); a WebSocket's ``Origin`` must be ``http://<Host>`` (compared case-insensitively:
a page of another origin -- another port too -- cannot open it, and a client that sends no
Origin is refused). Nothing here does I/O except :func:`load_token`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOOPBACK_NAMES", "SUBPROTOCOL", "TOKEN_PREFIX", "AuthRules", "TokenFileError", "default_token_file", "is_loopback", "load_token"]

_COOKIE_SALT = b"dsh-web cookie v1"
#: The names a browser on this machine (or at a tunnel's end) uses for the bridge.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
#: The WebSocket subprotocol the bridge answers with; the token rides as TOKEN_PREFIX + token.
SUBPROTOCOL = "dsh.v1"
TOKEN_PREFIX = "dsh.token."
_MAX_TOKEN_BYTES = 512  # a token file larger than this is not ours


class TokenFileError(Exception):
    """The token file or its directory is unsafe or unreadable (message says what to do)."""


def default_token_file() -> Path:
    """``$XDG_RUNTIME_DIR/dsh/web-token``, else ``/tmp/dsh-$UID/web-token`` (like the socket)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "dsh" / "web-token"
    return Path(f"/tmp/dsh-{os.getuid()}") / "web-token"


def load_token(path: Path, *, new: bool) -> str:
    """The token kept in ``path``: read it, or write a fresh one when ``new`` or absent."""
    _private_dir(path.parent)
    if not new:
        token = _read_token(path)
        if token is not None:
            return token
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def _private_dir(d: Path) -> None:
    """Make ``d`` (mode 0700) or check that it is ours and closed to others."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise TokenFileError(f"{d} is not a directory owned by you; pass --token-file")
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)


def _read_token(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TokenFileError(f"cannot open the token file {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise TokenFileError(f"{path} is not a regular file owned by you")
        if st.st_mode & 0o077:
            raise TokenFileError(
                f"{path} is readable by others (mode {st.st_mode & 0o777:o}): the token may "
                "have leaked; start with --new-token")
        text = os.read(fd, _MAX_TOKEN_BYTES + 1).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if len(text) < 32 or len(text) > _MAX_TOKEN_BYTES or not text.isprintable():
        return None  # damaged: a fresh one is written
    return text


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """``host:port`` with an IPv6 address in brackets (as a Host header writes it)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


@dataclass(frozen=True)
class AuthRules:
    """The checks of one listening bridge: its token, port and listen host."""

    token: str
    port: int
    listen_host: str

    @property
    def cookie_name(self) -> str:
        return f"dsh-web-{self.port}"

    @property
    def cookie_value(self) -> str:
        return hmac.new(self.token.encode(), _COOKIE_SALT, hashlib.sha256).hexdigest()

    def token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())

    def cookie_ok(self, cookies: dict[str, str]) -> bool:
        given = cookies.get(self.cookie_name)
        return given is not None and hmac.compare_digest(given.encode(), self.cookie_value.encode())

    def host_ok(self, host: str | None) -> bool:
        """A loopback name with any port (an SSH tunnel may use another local port), or the
        listen address exactly. DNS rebinding is about the name, so the port is free."""
        if host is None:
            return False
        host = host.lower()
        if host == host_port(self.listen_host, self.port).lower():
            return True
        name, sep, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if not sep:
            name, port = host, ""
        if port and not (port.isdigit() and 0 < int(port) <= 65535):
            return False
        return name in LOOPBACK_NAMES

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        """The WebSocket rule: ``Origin`` is ``http://<Host>`` of an allowed Host (scheme and
        host compared case-insensitively; browsers send them in lower case)."""
        if origin is None or not self.host_ok(host):
            return False
        return hmac.compare_digest(origin.lower().encode(), f"http://{host}".lower().encode())

    def subprotocol_ok(self, offered: list[str]) -> bool:
        """The page's proof that it holds the token (only its own origin's storage has it):
        ``dsh.v1`` and ``dsh.token.<token>`` among the offered subprotocols."""
        if SUBPROTOCOL not in offered:
            return False
        given = [p[len(TOKEN_PREFIX):] for p in offered if p.startswith(TOKEN_PREFIX)]
        return len(given) == 1 and self.token_ok(given[0])
