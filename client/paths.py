"""Where the client finds dshd's socket (PROTOCOL.md §1), and what an id may be.

Theory of operation: the client resolves the socket path by the rule the spec gives, on its
own (it never imports the daemon): an explicit path (``--socket``), then ``$DSH_SOCKET``,
then the user socket ``$XDG_RUNTIME_DIR/dsh/dshd.sock``, else ``/tmp/dsh-$UID/dshd.sock``.
A system-mode daemon's socket (``/run/dsh/dshd.sock``) is reached with ``--socket`` or
``DSH_SOCKET``. ``is_valid_id`` is the id rule of PROTOCOL.md §3.1 (checked before a request
is sent, so a bad ``--call-id`` is a usage error); the daemon checks it again.
Nothing here creates anything.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["socket_path", "is_valid_id"]

#: The id pattern and the reserved segments of PROTOCOL.md §3.1.
_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_RESERVED_IDS = frozenset({"__proto__", "constructor", "prototype"})


def socket_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The socket to connect to: ``explicit``, ``$DSH_SOCKET``, then the user default."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("DSH_SOCKET")
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "dsh" / "dshd.sock"
    return Path(f"/tmp/dsh-{os.getuid()}") / "dshd.sock"


def is_valid_id(value: object) -> bool:
    """True when ``value`` may name a session or a call."""
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None \
        and value not in _RESERVED_IDS
