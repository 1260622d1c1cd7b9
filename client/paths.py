"""Where the client finds dshd's socket (PROTOCOL.md §1), and what an id may be.

Theory of operation: the client resolves the socket path by the rule the spec gives, on its
own (it never imports the daemon): an explicit path (``--socket``), then ``$DSH_SOCKET``,
then the user socket ``$XDG_RUNTIME_DIR/dsh/dshd.sock``, else ``/tmp/dsh-$UID/dshd.sock``.
A system-mode daemon's socket (``/run/dsh/dshd.sock``) is reached with ``--socket`` or
``DSH_SOCKET``. ``is_valid_id`` is the id rule of PROTOCOL.md §3.1, written once in
``protocol.ids`` and re-exported here (checked before a request is sent, so a bad ``--call-id``
is a usage error); the daemon checks it again with the same rule.
Nothing here creates anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from protocol.ids import ID_CHARS, is_valid_id

__all__ = ["socket_path", "is_valid_id", "ID_CHARS"]


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

