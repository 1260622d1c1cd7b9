"""Where dshd keeps its socket and its state (PROTOCOL.md §1, STORAGE.md §1).

Theory of operation: the daemon and every client resolve the socket path the same way, so
both import this module. Resolution order for the socket: an explicit path (``--socket`` or
``DSH_SOCKET``), then system mode ``/run/dsh/dshd.sock``, then user mode
``$XDG_RUNTIME_DIR/dsh/dshd.sock``, else ``/tmp/dsh-$UID/dshd.sock``. The state directory is
``$XDG_STATE_HOME/dsh`` (default ``~/.local/state/dsh``) in user mode and ``/var/lib/dsh`` in
system mode. Nothing here creates anything. The id rule (``is_valid_id``) is
``protocol.ids``'s, re-exported for the rooms that already import it from here.
"""

from __future__ import annotations

import os
from pathlib import Path

from protocol.ids import ID_RE, RESERVED_IDS, is_valid_id

__all__ = [
    "ID_RE", "RESERVED_IDS", "SYSTEM_SOCKET", "SYSTEM_STATE", "is_valid_id", "is_within",
    "socket_path", "state_dir",
]

SYSTEM_SOCKET = Path("/run/dsh/dshd.sock")
SYSTEM_STATE = Path("/var/lib/dsh")


def socket_path(explicit: str | os.PathLike[str] | None = None, *, system: bool = False) -> Path:
    """Resolve the daemon socket path (PROTOCOL.md §1).

    ``explicit`` wins, then ``$DSH_SOCKET``, then the system or user default.
    """
    if explicit:
        return Path(explicit)
    env = os.environ.get("DSH_SOCKET")
    if env:
        return Path(env)
    if system:
        return SYSTEM_SOCKET
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "dsh" / "dshd.sock"
    return Path(f"/tmp/dsh-{os.getuid()}") / "dshd.sock"


def state_dir(explicit: str | os.PathLike[str] | None = None, *, system: bool = False) -> Path:
    """Resolve the state directory (STORAGE.md §1): explicit, ``$DSH_STATE_DIR``, then defaults."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("DSH_STATE_DIR")
    if env:
        return Path(env)
    if system:
        return SYSTEM_STATE
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "dsh"


def is_within(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """True when ``path`` is ``root`` or lies below it, symlinks resolved (a session directory
    inside the state directory would let its tools reach other sessions' logs)."""
    real_root = os.path.realpath(root)
    return os.path.commonpath([os.path.realpath(path), real_root]) == real_root
