"""The workspace a confined call may use, pinned and checked before confining (EXEC.md §3).

Theory of operation: every real provider first pins the workspace (:func:`pin_workspace`): it
opens the session's ``cwd`` with ``O_PATH|O_DIRECTORY``, requires the fd's own path
(``/proc/self/fd/N``) to be that ``cwd`` and to name the fd's directory right now, and runs
every check on it; the wrapped argv refers to the fd (bwrap ``--bind-fd``, the Landlock
launcher's inherited fd), which the caller passes to the child and closes (``fds``,
:func:`close_fds`). A name is never looked up twice, so a directory renamed for a symlink
between check and spawn cannot redirect the writable bind.

Then :func:`check_confinable` refuses, with :class:`~dshd.execution.confine.SandboxUnavailable`:
a workspace that is a system directory (:func:`refused_workspace`, the rule ``session.create``
applies too), any call once a hidden path (the state directory, the socket) is no longer where
it was when first seen (:class:`HiddenPathGuard`, by ``(st_dev, st_ino)``: masks sit on paths,
and a moved directory would be unmasked under its new name), and a workspace at or inside a
hidden path. Synchronous ``os`` calls only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dshd.execution.confine import CONFINING_MODES, SandboxUnavailable

__all__ = ["HiddenPathGuard", "PinnedWorkspace", "SANDBOX_TREES", "SYSTEM_DIRS",
           "check_confinable", "close_fds", "pin_workspace", "refused_workspace"]


#: Trees the sandbox builds afresh (``/proc``, ``/dev``, ``/run``) or the host's kernel interface
#: (``/sys``): a workspace at or below one would cover the sandbox's own, or hand it the host's.
SANDBOX_TREES = ("/proc", "/sys", "/dev", "/run")
#: System directories refused as a workspace themselves (directories below them are fine:
#: ``/tmp/project``, ``/var/www/site``, ``/usr/local/src/x``). ``/tmp`` is here because the
#: sandbox mounts a private ``/tmp``; ``/usr/*`` because ``/bin`` may resolve to ``/usr/bin``.
SYSTEM_DIRS = frozenset({
    "/", "/bin", "/boot", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/sbin",
    "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec",
    "/usr/local", "/usr/sbin", "/usr/share", "/var", "/var/lib", "/var/log", "/var/tmp",
})


def refused_workspace(path: str) -> str | None:
    """Why ``path`` cannot be a session's workspace, or None (EXEC.md §3).

    Refused: ``/`` and the system directories of :data:`SYSTEM_DIRS` themselves, and anything at
    or below :data:`SANDBOX_TREES`. Judged on the path as given *and* with symlinks resolved, so
    a link to ``/proc`` is refused too. A workspace below ``/tmp`` is fine: it is bound over the
    private ``/tmp`` at its own path.
    """
    for candidate in dict.fromkeys((os.path.normpath(path), os.path.realpath(path))):
        for tree in SANDBOX_TREES:
            if candidate == tree or candidate.startswith(tree + "/"):
                return (
                    f"{path} cannot be a session directory: {tree} is a system tree the "
                    "sandbox provides itself (or the host kernel's interface), and a workspace "
                    "there would hand tools the host's; use a project directory"
                )
        if candidate in SYSTEM_DIRS:
            return (
                f"{path} cannot be a session directory: {candidate} is a system directory "
                "(/, /etc, /usr, /var, /tmp, /home, ... are refused; a project directory "
                "below them is fine)"
            )
    return None


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class HiddenPathGuard:
    """Notices a hidden path (the state directory, the socket) no longer being where it was.

    The masks are put at *paths*; if something renames a hidden directory or one of its
    ancestors, the path names nothing (or a stand-in) and the real thing is unmasked at its new
    name. :meth:`check` pins ``(st_dev, st_ino)`` of each path and of its parent directory the
    first time it sees the path — the daemon's first confine, which precedes every tool's
    run — and on every later call compares; any difference raises :class:`SandboxUnavailable`
    naming the path. Moving it back makes the check pass again. Bounded: one entry per distinct
    hidden path (the daemon passes two).
    """

    MAX_PATHS = 64

    def __init__(self) -> None:
        self._pins: dict[str, tuple] = {}

    def check(self, paths: list[str], *, enforce: bool = True) -> None:
        """Pin unseen paths; with ``enforce``, raise when a pinned one changed."""
        for path in paths:
            now = (_identity(path), _identity(os.path.dirname(path) or "/"))
            pinned = self._pins.get(path)
            if pinned is None:
                if len(self._pins) < self.MAX_PATHS:
                    self._pins[path] = now
                continue
            if now != pinned and enforce:
                raise SandboxUnavailable(
                    f"{path} (hidden from tools: dshd's state directory or socket) is no longer "
                    "where it was when dshd started — it or a parent directory was moved or "
                    "replaced, so the sandbox's masks would not cover it. Every confined call "
                    "is refused until it is moved back or dshd is restarted."
                )


@dataclass(frozen=True)
class PinnedWorkspace:
    """The workspace held by an ``O_PATH`` fd: ``path`` is the fd's own path (from
    ``/proc/self/fd``), ``dev``/``ino`` its identity. Every check runs on ``path``, and the
    sandbox is given the fd (bwrap ``--bind-fd``) or the identity (the Landlock launcher checks
    its own open against it), never the name again: a directory renamed for a symlink between
    check and spawn cannot redirect the bind."""

    fd: int
    path: str
    dev: int
    ino: int


def close_fds(fds: list[int]) -> None:
    """Close every fd in ``fds`` (those :meth:`Provider.confine` opened) and empty the list."""
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass


def pin_workspace(workspace: str) -> PinnedWorkspace:
    """Open ``workspace`` (``O_PATH|O_DIRECTORY``) and return it pinned; the caller closes the fd.

    ``workspace`` must be canonical (the session's cwd is resolved once, at ``session.create``):
    the directory opened must be found at exactly that path — a symlink anywhere on the way
    (say, a directory of the path renamed away and a symlink put in its place) would make the
    open land elsewhere, and pinning *that* would only pin the attacker's choice.

    Raises :class:`SandboxUnavailable` when it cannot be opened, when the fd's own path is not
    ``workspace``, or when that path does not name the fd's directory right now (a path being
    swapped): fail closed, never guess.
    """
    try:
        fd = os.open(workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxUnavailable(
            f"the session directory {workspace} cannot be opened ({exc.strerror}); the call "
            "did not run"
        ) from None
    try:
        st = os.fstat(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if (path != os.path.normpath(workspace)
                or _identity_nofollow(path) != (st.st_dev, st.st_ino)):
            raise SandboxUnavailable(
                f"the session directory {workspace} is not where it was: the path now leads to "
                f"{path!r} (a directory in it was renamed, or replaced by a symlink); the "
                "call did not run — if the move was meant, start a session in the new place"
            )
    except BaseException:
        os.close(fd)
        raise
    return PinnedWorkspace(fd, path, st.st_dev, st.st_ino)


def _identity_nofollow(path: str) -> tuple[int, int] | None:
    try:
        if os.path.realpath(path) != path:
            return None
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_confinable(mode: str, workspace: str, hide: list[str], guard: HiddenPathGuard) -> None:
    """The checks every real provider makes before confining (after :func:`check_mode`).

    ``workspace``: the *pinned* path (:attr:`PinnedWorkspace.path`) in a confining mode. Pins
    the hidden paths (all modes) and, in a confining mode, raises :class:`SandboxUnavailable`
    when one was moved (:class:`HiddenPathGuard`), the workspace is refused
    (:func:`refused_workspace`: a session created before that rule existed), or the workspace
    lies at or inside a hidden path (the state directory: its bind would uncover it).
    """
    confining = mode in CONFINING_MODES
    guard.check(list(hide), enforce=confining)
    if not confining:
        return
    if why := refused_workspace(workspace):
        raise SandboxUnavailable(why)
    for path in hide:
        real = os.path.realpath(path)
        if real != "/" and os.path.commonpath([real, workspace]) == real:
            raise SandboxUnavailable(
                f"the session directory {workspace} lies inside {path} (dshd's state directory "
                "or socket), which tools must not reach; the call did not run"
            )
