"""Sandbox providers: ``confine(argv, mode, workspace) -> (argv', completeness)`` (EXEC.md §3).

Theory of operation
-------------------
A *provider* turns a ready-to-exec argv into one that runs the same command confined, and says
how complete that confinement is. :func:`probe` picks one provider at daemon start; the daemon
keeps it for its lifetime and reports :meth:`Provider.describe` in ``initialize`` and
``daemon.status``. Confining is pure argv rewriting: nothing is spawned by ``confine`` itself,
and the wrapped argv is what :func:`dshd.execution.process.run_command` spawns (and kills).

==================== =================== =================================================
provider             completeness        how
==================== =================== =================================================
``bwrap``            ``full``            namespaces + mounts (:mod:`.sandbox_bwrap`)
``landlock``         ``partial``         LSM rules applied by a launcher that then execs
                                         (:mod:`.sandbox_landlock`, :mod:`.landlock_exec`)
``none``             ``none``            nothing; every confining mode raises
                                         :class:`SandboxUnavailable`
==================== =================== =================================================

Modes: ``read-only`` and ``workspace-write`` are confined by every real provider;
``danger-full-access`` returns the argv unchanged with completeness ``none`` whatever the
provider (an explicit opt-in, never a fallback). The ``none`` provider never runs a confining
mode unconfined: it raises, and the session turns that into ``SANDBOX_UNAVAILABLE``.

Every real provider first pins the workspace (:func:`pin_workspace`): it opens the session's
``cwd`` with ``O_PATH|O_DIRECTORY``, requires the fd's own path (``/proc/self/fd/N``) to be that
``cwd`` and to name the fd's directory right now, and runs every check below on it; the wrapped
argv refers to the fd (bwrap ``--bind-fd``, the Landlock launcher's inherited fd), which the
caller passes to the child and closes (``fds``). A name is never looked up twice, so a directory
renamed for a symlink between check and spawn cannot redirect the writable bind (issue 11).

Before confining, every real provider (:func:`check_confinable`) refuses, with
:class:`SandboxUnavailable`: a workspace that is a system directory (:func:`refused_workspace`:
``/``, ``/etc``, ``/usr``, ``/tmp`` itself, anything at or under ``/proc``, ``/sys``, ``/dev``,
``/run`` — a bind there would cover the sandbox's own trees with the host's; ``session.create``
applies the same rule), and any call once a hidden path (the state directory, the socket) is no
longer where it was when first seen (:class:`HiddenPathGuard`, by ``(st_dev, st_ino)``): masks
sit on paths, and a moved directory would be unmasked under its new name; and a workspace at or
inside a hidden path (the state directory). The bwrap provider
also caps each call's tmpfs mounts and bounds their sum over running calls
(:class:`TmpBudget`).

The probe (:func:`probe`) tries ``bwrap`` then ``landlock`` (``auto``) or only the configured
one, and for each runs a **real** confined ``true`` and a **real** write that must fail — a
file next to (outside) a scratch workspace under ``workspace-write`` — plus a write inside the
workspace that must succeed. A provider whose binary is missing, whose namespaces cannot be
created (unprivileged container, AppArmor's user-namespace restriction, seccomp), or whose
write test escapes is skipped, and the sentence why is kept in ``describe()["skipped"]``.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import trio

__all__ = [
    "CONFINING_MODES",
    "HiddenPathGuard",
    "MODES",
    "NoSandbox",
    "PROBE_TIMEOUT",
    "Provider",
    "SandboxUnavailable",
    "TmpBudget",
    "PinnedWorkspace",
    "check_confinable",
    "close_fds",
    "pin_workspace",
    "probe",
    "refused_workspace",
    "self_test",
]

#: Every sandbox mode (EXEC.md §3).
MODES = ("read-only", "workspace-write", "danger-full-access")
#: The modes a provider must actually confine.
CONFINING_MODES = ("read-only", "workspace-write")
#: Seconds one probe command may take before its provider counts as broken.
PROBE_TIMEOUT = 20.0


class SandboxUnavailable(Exception):
    """No provider can confine this command; ``str(exc)`` is a sentence a person can act on.

    The session reports it as a ``tool/result`` with ``errorCode: SANDBOX_UNAVAILABLE``
    (EXEC.md §1, §3); the command did not run.
    """


@runtime_checkable
class Provider(Protocol):
    """What the daemon holds after :func:`probe` (EXEC.md §3).

    ``name``: ``"bwrap"`` | ``"landlock"`` | ``"none"``. ``completeness``: what the confining
    modes achieve, ``"full"`` | ``"partial"`` | ``"none"``. ``reason``: why this provider was
    chosen, what it cannot do, and why others were skipped.
    """

    name: str
    completeness: str
    reason: str

    def describe(self) -> dict:
        """``{"provider", "completeness", "reason", "skipped": [{"provider", "reason"}]}``."""
        ...

    def confine(
        self,
        argv: list[str],
        mode: str,
        workspace: str,
        *,
        hide: list[str] = (),
        network: bool = False,
        fds: list[int] | None = None,
    ) -> tuple[list[str], str]:
        """Return ``(wrapped argv, completeness)`` for ``mode`` with ``workspace`` as the cwd.

        ``fds``: receives the fds the wrapped argv refers to (the workspace pinned by fd, a
        tmpfs lease); the caller passes them to the child and closes them after the spawn
        (``run_command(pass_fds=...)`` does both). The bwrap provider requires it.

        ``hide``: paths the tool must not see (the daemon's state directory, its socket).
        ``network``: allow the network in ``workspace-write``. ``danger-full-access`` gives
        ``(argv, "none")``. Raises :class:`SandboxUnavailable` (provider ``none``) or
        ``ValueError`` (unknown mode, relative workspace).
        """
        ...


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


#: Defaults of the private tmpfs caps (config ``tmp_size_bytes`` / ``tmp_total_bytes``).
DEFAULT_TMP_SIZE = 512 * 1024 * 1024
DEFAULT_TMP_TOTAL = 8 * 1024 * 1024 * 1024


class TmpBudget:
    r"""Bounds the RAM that the running calls' private tmpfs mounts may hold together.

    The pages of a sandbox's ``/tmp`` count against dshd's cgroup, so each call's tmpfs mounts
    are capped (``per_call`` bytes in all, see the bwrap provider) and the sum over running calls
    is bounded by ``total``. A call's share is a *lease*: a file ``<lease_dir>/lease-<token>``
    that :meth:`reserve` creates and ``flock``\ s (shared) through an fd it returns; that fd is
    passed to bwrap (``--sync-fd``: bwrap keeps it open while the sandbox lives) and the daemon
    closes its own copy after the spawn. The lock belongs to the open file description, so it
    is held from the reservation on — with no window in which a running call's lease looks
    unlocked — until the last process of the sandbox is gone (or, if the spawn never happens,
    until the daemon closes the fd). A lease counts while it is locked; an unlocked one is
    removed. The file is made under a ``new-`` name and renamed only once locked, so a count
    never sees it unlocked. A call that would take the sum past ``total`` fails closed
    (:class:`SandboxUnavailable`); it is not queued.

    (Before: bwrap ``--chmod``\ ed the lease and took a POSIX lock on it with ``--lock-file``,
    but bwrap takes that lock late in its setup, and a count in between removed the lease of a
    starting call — so 20 calls ran under a budget of 14.)
    """

    NEW_GRACE = 60.0

    def __init__(self, lease_dir: str, per_call: int, total: int) -> None:
        self.lease_dir = lease_dir
        self.per_call = per_call
        self.total = total

    def _counts(self, name: str) -> bool:
        """Whether lease ``name`` still holds its share (removes it when it does not)."""
        path = os.path.join(self.lease_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True  # a sandbox (or a reservation not yet spawned) holds it
            # Unlocked: the call ended. Removed while we hold the lock, so no new holder races.
            try:
                os.unlink(path)
            except OSError:
                pass
            return False
        finally:
            os.close(fd)

    def _sweep_new(self, names: list[str]) -> None:
        """Remove ``new-`` files a crash left behind (older than :data:`NEW_GRACE`)."""
        for name in names:
            if not name.startswith("new-"):
                continue
            path = os.path.join(self.lease_dir, name)
            try:
                if time.time() - os.stat(path, follow_symlinks=False).st_mtime > self.NEW_GRACE:
                    os.unlink(path)
            except OSError:
                pass

    def in_use(self) -> int:
        """How many leases hold a share now (stale ones are removed on the way)."""
        try:
            names = os.listdir(self.lease_dir)
        except FileNotFoundError:
            return 0
        self._sweep_new(names)
        return sum(1 for name in names if name.startswith("lease-") and self._counts(name))

    def reserve(self) -> int:
        """A new lease's locked fd (the caller passes it to the sandbox and closes it), or
        :class:`SandboxUnavailable` when the sum is spent."""
        os.makedirs(self.lease_dir, mode=0o700, exist_ok=True)
        running = self.in_use()
        if (running + 1) * self.per_call > self.total:
            raise SandboxUnavailable(
                f"the private /tmp budget of running calls is spent: {running} running calls "
                f"hold {running * self.per_call} bytes of the {self.total} allowed "
                f"(tmp_total_bytes; {self.per_call} bytes per call, tmp_size_bytes plus /dev/shm "
                "and /run); the call did not run — retry when a call has finished, or raise "
                "tmp_total_bytes"
            )
        token = secrets.token_hex(8)
        new = os.path.join(self.lease_dir, f"new-{token}")
        fd = os.open(new, os.O_CREAT | os.O_EXCL | os.O_RDONLY | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.rename(new, os.path.join(self.lease_dir, f"lease-{token}"))
        except BaseException:
            os.close(fd)
            try:
                os.unlink(new)
            except OSError:
                pass
            raise
        return fd


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


def check_mode(mode: str, workspace: str) -> None:
    """Raise ``ValueError`` for an unknown mode or a relative workspace path."""
    if mode not in MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}; expected one of {', '.join(MODES)}")
    if not os.path.isabs(workspace):
        raise ValueError(f"the workspace must be an absolute path, not {workspace!r}")


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


def skipped_list(skipped: tuple[tuple[str, str], ...]) -> list[dict]:
    return [{"provider": name, "reason": reason} for name, reason in skipped]


class Verdict:
    """``describe()`` for the providers: the verdict ``initialize`` and ``daemon.status`` show."""

    name: str
    completeness: str
    reason: str
    skipped: tuple[tuple[str, str], ...]

    def describe(self) -> dict:
        return {
            "provider": self.name,
            "completeness": self.completeness,
            "reason": self.reason,
            "skipped": skipped_list(self.skipped),
        }


@dataclass(frozen=True)
class NoSandbox(Verdict):
    """Provider ``none``: ``danger-full-access`` runs unchanged; every other mode raises
    :class:`SandboxUnavailable` (never a silent unsandboxed run)."""

    name: str = "none"
    completeness: str = "none"
    reason: str = "no sandbox provider is configured"
    skipped: tuple[tuple[str, str], ...] = field(default=())

    def confine(
        self,
        argv: list[str],
        mode: str,
        workspace: str,
        *,
        hide: list[str] = (),
        network: bool = False,
        fds: list[int] | None = None,
    ) -> tuple[list[str], str]:
        check_mode(mode, workspace)
        if mode == "danger-full-access":
            return list(argv), "none"
        raise SandboxUnavailable(
            f"No sandbox can confine this command in {mode} mode: {self.reason}. "
            "Install bubblewrap (bwrap) or enable Landlock and restart dshd, or switch the "
            "session to danger-full-access to run it unconfined on purpose."
        )


def _shell() -> str:
    return "/bin/sh" if os.path.exists("/bin/sh") else (shutil.which("sh") or "/bin/sh")


async def _run_probe_command(argv: list[str], cwd: Path,
                             fds: list[int]) -> subprocess.CompletedProcess:
    try:
        with trio.fail_after(PROBE_TIMEOUT):
            return await trio.run_process(
                argv,
                cwd=str(cwd),
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                start_new_session=True,
                pass_fds=tuple(fds),
            )
    finally:
        close_fds(fds)


def _stderr_tail(result: subprocess.CompletedProcess) -> str:
    text = (result.stderr or b"").decode("utf-8", "replace").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else f"exit status {result.returncode}, no message"


async def self_test(provider: Provider, scratch_dir: Path) -> str | None:
    """Run the real probe commands under ``provider``; None when it confines, else why not.

    1. ``true`` under ``workspace-write`` must exit 0;
    2. under ``workspace-write`` a write inside the workspace must show up on the host and a
       write to ``scratch_dir`` (outside it) must not.

    Each command is bounded by :data:`PROBE_TIMEOUT`. The scratch files are removed.
    """
    token = secrets.token_hex(6)
    workspace = scratch_dir / f"probe-workspace-{token}"
    outside = scratch_dir / f"probe-outside-{token}"
    inside = workspace / "inside"
    workspace.mkdir(parents=True)
    try:
        true = shutil.which("true") or "/bin/true"
        fds: list[int] = []
        argv, _ = provider.confine([true], "workspace-write", str(workspace), fds=fds)
        try:
            result = await _run_probe_command(argv, workspace, fds)
        except trio.TooSlowError:
            return f"a confined `true` did not finish within {PROBE_TIMEOUT:g} s"
        except OSError as exc:
            return f"a confined `true` could not start ({exc.strerror or exc})"
        if result.returncode != 0:
            return f"a confined `true` failed: {_stderr_tail(result)}"
        # Judged on the host only: under bwrap the outside write may "succeed" into the private
        # /tmp when the scratch directory lies under /tmp, which is no escape.
        script = 'echo ok > "$1" || exit 3; echo escaped > "$2"; exit 0'
        argv, _ = provider.confine(
            [_shell(), "-c", script, "sh", str(inside), str(outside)],
            "workspace-write",
            str(workspace),
            fds=fds,
        )
        try:
            result = await _run_probe_command(argv, workspace, fds)
        except trio.TooSlowError:
            return f"the confined write test did not finish within {PROBE_TIMEOUT:g} s"
        if outside.exists() or os.path.lexists(outside):
            return (
                f"the confined write test escaped: a write to {outside}, outside the "
                "workspace, succeeded"
            )
        if result.returncode != 0 or not inside.exists():
            return f"a write inside the workspace failed under confinement: {_stderr_tail(result)}"
        return None
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        try:
            os.unlink(outside)
        except OSError:
            pass


async def probe(
    preferred: str = "auto",
    *,
    scratch_dir: Path,
    bwrap_path: str | None = None,
    python: str | None = None,
    tmp_size_bytes: int = DEFAULT_TMP_SIZE,
    tmp_total_bytes: int | None = DEFAULT_TMP_TOTAL,
) -> Provider:
    """Pick the sandbox provider for this daemon (EXEC.md §3).

    ``preferred``: ``"auto"`` tries ``bwrap`` then ``landlock`` then gives :class:`NoSandbox`;
    ``"bwrap"``/``"landlock"`` tries only that one (a failure gives :class:`NoSandbox` with the
    reason); ``"none"`` gives :class:`NoSandbox` at once. ``scratch_dir``: a directory the
    daemon owns (created if missing) for the probe's workspace and, under Landlock, the
    per-call temporary directories (``<scratch_dir>/landlock-tmp``). ``bwrap_path``: the bwrap
    binary (default: ``bwrap`` on ``$PATH``). ``python``: the interpreter that runs the Landlock
    launcher (default ``sys.executable``). ``tmp_size_bytes``: the cap of a call's private
    ``/tmp`` (bwrap); ``tmp_total_bytes``: the bound on the running calls' tmpfs mounts together
    (:class:`TmpBudget`; None: no bound).

    Never raises for a broken provider — that is a verdict, reported by ``describe()``.
    Raises ``ValueError`` for an unknown ``preferred``. Takes up to a few hundred ms (it runs
    real processes); each is bounded by :data:`PROBE_TIMEOUT`.
    """
    from dshd.execution.sandbox_bwrap import probe_bwrap
    from dshd.execution.sandbox_landlock import probe_landlock

    if preferred not in ("auto", "bwrap", "landlock", "none"):
        raise ValueError(
            f"unknown sandbox provider {preferred!r}; expected auto, bwrap, landlock or none"
        )
    if preferred == "none":
        return NoSandbox(
            reason='the sandbox provider is configured as "none", so only '
            "danger-full-access commands can run"
        )
    scratch_dir = Path(scratch_dir)
    scratch_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    candidates = ["bwrap", "landlock"] if preferred == "auto" else [preferred]
    skipped: list[tuple[str, str]] = []
    for name in candidates:
        if name == "bwrap":
            provider, why_not = await probe_bwrap(
                scratch_dir, bwrap_path, tuple(skipped), tmp_size_bytes, tmp_total_bytes
            )
        else:
            provider, why_not = await probe_landlock(scratch_dir, python, tuple(skipped))
        if provider is not None:
            return provider
        skipped.append((name, why_not))
    summary = "; ".join(f"{name}: {why}" for name, why in skipped)
    if preferred == "auto":
        reason = f"no sandbox provider works here ({summary})"
    else:
        reason = f"the configured sandbox provider {preferred} does not work here ({summary})"
    return NoSandbox(reason=reason, skipped=tuple(skipped))
