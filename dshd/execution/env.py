"""The environment a tool starts with (EXEC.md §1): documented and minimal, never the daemon's.

Theory of operation
-------------------
A daemon's environment holds its secrets (API keys, tokens), its hand-over from systemd, and
its own socket and state paths; in system mode it is root's. None of that reaches a tool.
:func:`tool_env` builds the base environment of every tool from, in order:

1. ``PATH``: the daemon's, else :data:`DEFAULT_PATH`;
2. the locale and terminal: ``LANG``, ``LANGUAGE``, every ``LC_*``, ``TERM`` and ``TZ`` when
   the daemon has them (``TERM`` defaults to ``dumb``: tools have no terminal);
3. the owner's identity from the password database: ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``
   (the owner is the session's uid in system mode, the daemon's own uid otherwise);
4. each variable named in the config's ``pass_env`` that the daemon has.

Never included, whatever ``pass_env`` says: ``DSH_*`` (the daemon's socket and state), the
systemd hand-over (``NOTIFY_SOCKET``, ``LISTEN_*``, ``WATCHDOG_*``, ``INVOCATION_ID``) and the
model's API key variable. The session's ``env`` and ``DSH_CALL_ID``/``DSH_SESSION_ID`` are set
on top of this by the caller, inside the sandbox (by ``env(1)``, after the wrapper has run).
:func:`dshd.execution.hosted.run_hosted` adds ``DSH_RUN``: a random token of the run, which
its kill sweep looks for (a tool should leave it alone; unsetting it only lets the tool's own
``setsid`` children escape the sweep).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping

__all__ = ["DEFAULT_PATH", "tool_env", "never_passed"]

#: ``PATH`` when the daemon has none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Variables copied from the daemon when set (plus every ``LC_*``).
LOCALE_VARS = ("LANG", "LANGUAGE", "TERM", "TZ")
#: Daemon variables that never reach a tool (exact names; ``DSH_*`` and ``LISTEN_*`` by prefix).
_DAEMON_ONLY = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID"})
_DAEMON_ONLY_PREFIXES = ("DSH_", "LISTEN_")


def never_passed(name: str) -> bool:
    """True for a daemon variable no tool may inherit (``pass_env`` cannot add it)."""
    return name in _DAEMON_ONLY or name.startswith(_DAEMON_ONLY_PREFIXES)


def owner_identity(uid: int) -> dict[str, str]:
    """``HOME``/``USER``/``LOGNAME``/``SHELL`` of ``uid`` from the password database (a uid
    without an entry gets ``HOME=/`` and its number as the name)."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return {"HOME": "/", "USER": str(uid), "LOGNAME": str(uid), "SHELL": "/bin/sh"}
    return {"HOME": pw.pw_dir or "/", "USER": pw.pw_name, "LOGNAME": pw.pw_name,
            "SHELL": pw.pw_shell or "/bin/sh"}


def tool_env(
    owner_uid: int,
    *,
    pass_env: Iterable[str] = (),
    secret: Iterable[str] = (),
    daemon_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The base environment of a tool run for ``owner_uid`` (see the module doc).

    ``pass_env``: names copied from the daemon's environment when set. ``secret``: further
    names that never pass (the model's API key variable). ``daemon_env``: default
    ``os.environ``.
    """
    src = os.environ if daemon_env is None else daemon_env
    blocked = set(secret)
    env = {"PATH": src.get("PATH") or DEFAULT_PATH, "TERM": "dumb"}
    for name, value in src.items():
        if name in LOCALE_VARS or name.startswith("LC_"):
            env[name] = value
    env.update(owner_identity(owner_uid))
    for name in pass_env:
        if name in src and not never_passed(name) and name not in blocked:
            env[name] = src[name]
    return env
