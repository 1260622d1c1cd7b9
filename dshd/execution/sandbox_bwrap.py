"""The ``bwrap`` sandbox provider: namespaces and mounts, completeness ``full`` (EXEC.md §3).

Theory of operation
-------------------
``confine`` rewrites ``argv`` into a bubblewrap command line; the daemon spawns ``bwrap`` as the
process-group leader and kills it to cancel. The command line, in order:

``--unshare-all`` (user, pid, net, ipc, uts, cgroup namespaces; ``--share-net`` only for
``workspace-write`` with ``network=True``), ``--unshare-user --disable-userns`` when this bwrap
has it (no nested user namespace inside, so no way to regain capabilities there),
``--cap-drop ALL`` (bwrap *keeps* every capability when run by root unless told otherwise),
``--die-with-parent`` (PR_SET_PDEATHSIG: the sandbox dies with the daemon — the runner spawns
from the trio thread, since the signal fires when the forking *thread* exits), then the mounts,
then ``--chdir <workspace>``. No ``--new-session``: it moved the command out of the process
group, so cancel's SIGTERM never reached it; the runner's ``start_new_session`` already leaves
the sandbox without a controlling terminal (stdin is ``/dev/null``), so TIOCSTI has no target.
The runner spares bwrap's own two processes (:attr:`BwrapProvider.wrapper_comm`) from SIGTERM.

Mounts are applied in argv order, and a later mount covers an earlier one, so they are sorted by
path depth (parents first; at equal depth a hidden path, then the workspace and the directories
pinned for a mask, then the sandbox's own trees — so nothing ever covers those):

* ``--ro-bind / /`` — the whole tree read-only (bwrap remounts every submount read-only too);
* ``--proc /proc`` (a fresh procfs of the new pid namespace: ``/proc/self/root`` is the
  sandbox's own read-only root and no host process is visible), remounted read-only at the end
  (bwrap's own cover of ``/proc/sys`` is skipped for root, whose tools could otherwise write
  the host's global sysctls), ``--dev /dev`` (a fresh minimal ``/dev``, remounted read-only at
  the end) with ``/dev/shm`` a private tmpfs of at most ``min(tmp_size, 64 MiB)``,
  ``--size tmp_size --tmpfs /tmp`` (private ``/tmp``, capped: a tool that fills it gets
  ``ENOSPC``; the pages count against dshd's cgroup), a private ``/run`` of at most 4 MiB
  (the host's IPC sockets — the system and session D-Bus, ``/run/systemd/private``,
  ``/run/docker.sock``, a database's socket, ``$XDG_RUNTIME_DIR`` with dshd's own user-mode
  socket — are not there to connect to; a Unix socket on a read-only mount still accepts
  connections, and a root daemon's tool talking to systemd is a full escape), with
  ``/run/lock`` recreated, ``/run/shm`` re-linked and the directory ``/etc/resolv.conf`` points
  into bound back when it lies under ``/run``;
* each ``hide`` path: ``--tmpfs`` over a directory (it shows up empty; ``--remount-ro`` at the
  end of the mounts makes it read-only, so a write there fails instead of vanishing),
  ``--ro-bind /dev/null`` over anything else (a Unix socket then refuses connections). When the
  hidden path lies inside the workspace (cwd = ``$HOME``, state in ``~/.local/state/dsh``), each
  directory between the workspace and it is bound onto itself: a mount point cannot be renamed
  or removed (``EBUSY``), so ``mv .local/state .local/state.x`` cannot carry the state dir out
  from under its mask for the next call;
* the workspace at its own path, **from its pinned fd**: ``--bind-fd`` in ``workspace-write``,
  ``--ro-bind-fd`` in ``read-only`` — always, so that neither the private ``/tmp`` nor a hidden
  directory hides it. :func:`dshd.execution.sandbox.pin_workspace` opened it (``O_PATH``) and
  every check ran on the fd's own path, which must be the session's ``cwd``; the directories
  pinned for a mask are opened below that fd without following symlinks and bound by fd too.
  A path string handed to bwrap would be looked up again, following symlinks: a directory of
  it renamed for a symlink between check and mount bound the host's ``/`` read-write (issue 11).
  bwrap resolves the fd to a path itself, mounts, and compares ``(st_dev, st_ino)`` of the
  mount with the fd's, dying on a difference; a mount point that is a symlink at that instant
  fails too. ``--chdir`` is a path inside the sandbox: if it is swapped there, it leads into the
  read-only tree (only the pinned workspace and the private tmpfs mounts are writable);
* the tmpfs lease (:class:`dshd.execution.sandbox.TmpBudget`): its fd, locked (``flock``) by
  the daemon at reservation, passed with ``--sync-fd`` — bwrap keeps it open, outside the
  command's reach, while the sandbox lives — which is how the daemon bounds the sum of the
  running calls' tmpfs mounts (``tmp_total_bytes``). User mode only (the daemon passes no
  bound in system mode; only the per-call caps hold there);
* ``--dir /dev/.dsh-sandbox``: the mark the peer check looks for in bwrap's command line.

Refused before any of this (:func:`dshd.execution.sandbox.check_confinable`): a system
directory as the workspace (``/``, ``/etc``, ``/tmp`` itself, anything under ``/proc``,
``/sys``, ``/dev``, ``/run``), and any confined call once a hidden path was moved.

Other host sockets (a socket outside ``/run`` and ``/tmp``) stay reachable unless listed in
``hide``; the daemon passes its state directory and its socket there.

Escapes this closes: symlinks or ``..`` in the workspace lead onto read-only mounts; hard links
out of the workspace cross a mount (``EXDEV``); the network namespace has only its own loopback;
unmounting a mask needs capabilities nobody inside has. The environment passes through unchanged
(``DSH_CALL_ID``/``DSH_SESSION_ID`` included). Not limited: memory outside the tmpfs mounts,
disk use in the workspace, CPU, reading files the daemon's user may read outside ``hide``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import trio

from dshd.execution.confine import SandboxUnavailable, Verdict, check_mode
from dshd.execution.self_test import PROBE_TIMEOUT, self_test
from dshd.execution.tmp_budget import DEFAULT_TMP_SIZE, TmpBudget
from dshd.execution.workspace import (
    HiddenPathGuard,
    PinnedWorkspace,
    check_confinable,
    close_fds,
    pin_workspace,
)

__all__ = ["BwrapProvider", "probe_bwrap"]

#: Hint appended when bwrap cannot create its namespaces.
NAMESPACE_HINT = (
    "; user namespaces look unavailable (check sysctl user.max_user_namespaces, "
    "kernel.unprivileged_userns_clone, AppArmor's kernel.apparmor_restrict_unprivileged_userns, "
    "or the container's seccomp profile)"
)


#: Caps of the other writable tmpfs mounts of a call (``/dev/shm``, ``/run``), in bytes.
SHM_SIZE = 64 * 1024 * 1024
RUN_SIZE = 4 * 1024 * 1024
#: Where a call's tmpfs lease (:class:`dshd.execution.sandbox.TmpBudget`) shows up inside.
LEASE_DEST = "/dev/.dsh-tmp-lease"
#: An empty directory every sandbox of dshd has: it marks bwrap's command line for the peer
#: check (:mod:`dshd.execution.peers`), and tells a tool it runs in a dsh sandbox.
SANDBOX_MARK = "/dev/.dsh-sandbox"
#: Mount points the sandbox provides itself; nothing may be mounted over them afterwards.
OWN_MOUNTS = ("/proc", "/dev", "/tmp", "/run")


@dataclass(frozen=True)
class BwrapProvider(Verdict):
    """Provider ``bwrap`` (see the module doc). ``path``: the bwrap binary; ``version``: its
    ``--version`` line; ``disable_userns``: pass ``--unshare-user --disable-userns``;
    ``tmp_size``: the cap of a call's private ``/tmp`` in bytes; ``budget``: the bound on the
    running calls' tmpfs sum (None: per-call caps only, as in the probe)."""

    path: str
    version: str = "bubblewrap"
    disable_userns: bool = True
    reason: str = ""
    skipped: tuple[tuple[str, str], ...] = field(default=())
    name: str = "bwrap"
    completeness: str = "full"
    tmp_size: int = DEFAULT_TMP_SIZE
    budget: TmpBudget | None = field(default=None, compare=False, repr=False)
    guard: HiddenPathGuard = field(default_factory=HiddenPathGuard, compare=False, repr=False)

    @property
    def process_marker(self) -> tuple[str, str]:
        """``(bwrap path, marker)``: what every dsh sandbox's command line carries, for the
        peer check (:mod:`dshd.execution.peers`) — whichever dshd made it: no confined tool
        may drive any dshd."""
        return self.path, f"\0--dir\0{SANDBOX_MARK}\0"

    @property
    def per_call_tmpfs(self) -> int:
        """Bytes of RAM one call's writable tmpfs mounts may hold (/tmp, /dev/shm, /run)."""
        return self.tmp_size + min(self.tmp_size, SHM_SIZE) + RUN_SIZE

    @property
    def wrapper_comm(self) -> str:
        """The process name (``comm``, 15 bytes at most) of bwrap's own processes."""
        return os.path.basename(self.path)[:15]

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
        """``(bwrap argv, "full")``; ``danger-full-access`` → ``(argv, "none")`` (EXEC.md §3).

        ``workspace``: absolute; pinned by an ``O_PATH`` fd (:func:`pin_workspace`), checked on
        the fd's own path, and bound from the fd (``--bind-fd``) at that path, which is also the
        new cwd. ``fds``: a list that receives the fds the argv refers to (the workspace, the
        directories pinned for a mask, the tmpfs lease): the caller passes them to the child
        (``pass_fds``) and closes them after the spawn (:func:`close_fds`); required in a
        confining mode (``ValueError`` without it). ``hide``: paths masked inside (missing ones
        are skipped; ``/`` is refused with ``ValueError``). ``network``: honoured in
        ``workspace-write`` only. Raises :class:`SandboxUnavailable` for a refused or moving
        workspace, a moved hidden path or a spent tmpfs budget (and then leaves ``fds`` empty).
        """
        check_mode(mode, workspace)
        if mode == "danger-full-access":
            check_confinable(mode, workspace, list(hide), self.guard)
            return list(argv), "none"
        if fds is None:
            raise ValueError("bwrap confine needs fds= (the pinned workspace is passed by fd)")
        try:
            return self._confine(argv, mode, workspace, list(hide), network, fds)
        except BaseException:
            close_fds(fds)
            raise

    def _confine(self, argv: list[str], mode: str, workspace: str, hide: list[str],
                 network: bool, fds: list[int]) -> tuple[list[str], str]:
        pinned = pin_workspace(workspace)
        fds.append(pinned.fd)
        ws = pinned.path
        check_confinable(mode, ws, hide, self.guard)
        out = [self.path, "--unshare-all"]
        if network and mode == "workspace-write":
            out.append("--share-net")
        if self.disable_userns:
            out += ["--unshare-user", "--disable-userns"]
        out += ["--cap-drop", "ALL", "--die-with-parent"]
        mounts, remount_ro = self._mounts(pinned, mode == "workspace-write", hide, fds)
        for _, _, args in mounts:
            out += args
        if self.budget is not None:
            lease = self.budget.reserve()
            fds.append(lease)
            # bwrap keeps the lease's locked fd open while the sandbox lives (TmpBudget).
            out += ["--sync-fd", str(lease)]
        out += ["--dir", SANDBOX_MARK]
        # Last, so that bwrap could still create mount points inside a mask or in /dev.
        # /proc read-only too: bwrap covers /proc/sys and /proc/sysrq-trigger only when
        # access(W_OK) says they are writable, which is wrong for root (their mode is 0555 and
        # 0200), so a root daemon's tool could write the host's sysctls and the SysRq trigger.
        out += remount_ro + ["--remount-ro", "/dev", "--remount-ro", "/proc"]
        out += ["--chdir", ws, "--", *argv]
        return out, self.completeness

    def _mounts(
        self, pinned: PinnedWorkspace, writable: bool, hide: list[str], fds: list[int]
    ) -> tuple[list[tuple[str, int, list[str]]], list[str]]:
        """The sorted mount list and the ``--remount-ro`` tail (see the module doc)."""
        # (path, tie-break, args): sorted by depth, then tie-break, so parents mount first and,
        # at equal depth, the sandbox's own /proc, /dev, /tmp, /run mount last (never covered).
        ws = pinned.path
        bind_fd = "--bind-fd" if writable else "--ro-bind-fd"
        shm = min(self.tmp_size, SHM_SIZE)
        mounts: list[tuple[str, int, list[str]]] = [
            ("/", 0, ["--ro-bind", "/", "/"]),
            ("/proc", 3, ["--proc", "/proc"]),
            ("/dev", 3, ["--dev", "/dev"]),
            ("/dev/shm", 3, ["--size", str(shm), "--tmpfs", "/dev/shm"]),
            ("/tmp", 3, ["--size", str(self.tmp_size), "--tmpfs", "/tmp"]),
            *_private_run(),
        ]
        remount_ro: list[str] = []
        pinned_dirs: set[str] = set()
        for path in hide:
            real = os.path.realpath(path)
            if real == "/":
                raise ValueError("cannot hide / from a sandboxed command")
            if os.path.isdir(real):
                mounts.append((real, 1, ["--tmpfs", real]))
                remount_ro += ["--remount-ro", real]
            elif os.path.lexists(real):
                mounts.append((real, 1, ["--ro-bind", "/dev/null", real]))
            else:
                continue
            # A mask inside the workspace holds against renames: each directory between the
            # workspace and the mask becomes a mount point (bound onto itself), and a mount
            # point cannot be renamed or removed (EBUSY) — so the mask stays on its path. Each
            # is opened below the workspace's fd without following symlinks and bound by fd.
            parent = os.path.dirname(real)
            while parent != ws and parent.startswith(ws.rstrip("/") + "/"):
                if parent not in pinned_dirs:
                    pinned_dirs.add(parent)
                    fd = _open_below(pinned.fd, os.path.relpath(parent, ws), parent)
                    fds.append(fd)
                    mounts.append((parent, 2, [bind_fd, str(fd), parent]))
                parent = os.path.dirname(parent)
        mounts.append((ws, 2, [bind_fd, str(pinned.fd), ws]))
        mounts.sort(key=lambda m: (0 if m[0] == "/" else len(Path(m[0]).parts), m[1]))
        return mounts, remount_ro


def _open_below(dir_fd: int, relative: str, shown: str) -> int:
    """An ``O_PATH`` fd of ``relative`` below ``dir_fd``, no symlink followed on the way."""
    fd = os.dup(dir_fd)
    try:
        for part in Path(relative).parts:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as exc:
        os.close(fd)
        raise SandboxUnavailable(
            f"{shown} (between the session directory and a hidden path) cannot be pinned "
            f"({exc.strerror}: renamed or replaced by a symlink?); the call did not run"
        ) from None
    return fd


def _private_run() -> list[tuple[str, int, list[str]]]:
    """A private ``/run`` (host IPC sockets gone) that still resolves DNS and has ``/run/lock``.

    ``/etc/resolv.conf`` is often a symlink into ``/run`` (systemd-resolved, NetworkManager,
    resolvconf): the directory it points into is bound back read-only.
    """
    if not os.path.isdir("/run") or os.path.islink("/run"):
        return []
    mounts = [("/run", 3, ["--size", str(RUN_SIZE), "--tmpfs", "/run"]),
              ("/run/lock", 3, ["--dir", "/run/lock"])]
    if os.path.islink("/run/shm"):
        mounts.append(("/run/shm", 3, ["--symlink", os.readlink("/run/shm"), "/run/shm"]))
    resolv_dir = os.path.dirname(os.path.realpath("/etc/resolv.conf"))
    if resolv_dir.startswith("/run/") and os.path.isdir(resolv_dir):
        mounts.append((resolv_dir, 3, ["--ro-bind", resolv_dir, resolv_dir]))
    return mounts


async def _capture(argv: list[str]) -> subprocess.CompletedProcess:
    with trio.fail_after(PROBE_TIMEOUT):
        return await trio.run_process(
            argv,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


async def probe_bwrap(
    scratch_dir: Path,
    bwrap_path: str | None,
    skipped: tuple[tuple[str, str], ...],
    tmp_size: int = DEFAULT_TMP_SIZE,
    tmp_total: int | None = None,
) -> tuple[BwrapProvider | None, str]:
    """``(provider, "")`` when bwrap confines here, else ``(None, why not)`` (EXEC.md §3).

    ``bwrap_path``: the binary to use, default ``bwrap`` on ``$PATH``. ``skipped``: providers
    already skipped, carried into the provider's ``describe()``. Tries ``--disable-userns``
    first when this bwrap knows it, and without it if that alone fails.
    """
    path = bwrap_path or shutil.which("bwrap")
    if path is None:
        return None, "bwrap was not found on PATH; install bubblewrap for the full sandbox"
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return None, f"{path} does not exist or is not executable; install bubblewrap"
    try:
        version = await _capture([path, "--version"])
        helptext = await _capture([path, "--help"])
    except (OSError, trio.TooSlowError) as exc:
        return None, f"{path} could not be run ({getattr(exc, 'strerror', None) or exc!r})"
    version_line = version.stdout.decode("utf-8", "replace").strip() or "bubblewrap"
    knows_disable = b"--disable-userns" in helptext.stdout + helptext.stderr
    first_failure = None
    for disable in ([True, False] if knows_disable else [False]):
        provider = BwrapProvider(path, version_line, disable, "", skipped, tmp_size=tmp_size)
        failure = await self_test(provider, scratch_dir)
        if failure is None:
            nested = (
                "nested user namespaces disabled"
                if disable
                else "nested user namespaces NOT disabled (this bwrap or kernel refuses "
                "--disable-userns; no capabilities are held inside either way)"
            )
            reason = (
                f"{version_line} at {path}: user, pid, network, ipc, uts and cgroup namespaces, "
                f"read-only root, private /tmp (at most {tmp_size} bytes), /run, /dev and /proc, "
                "hidden state paths that hold against renames, all "
                f"capabilities dropped, {nested}; probe: a confined `true` ran and a write "
                "outside the workspace was refused"
            )
            if skipped:
                reason += "; skipped " + ", ".join(f"{n} ({why})" for n, why in skipped)
            final = BwrapProvider(path, version_line, disable, reason, skipped, tmp_size=tmp_size)
            if tmp_total is not None:
                budget = TmpBudget(str(Path(scratch_dir) / "tmp-leases"),
                                   final.per_call_tmpfs, tmp_total)
                final = dataclasses.replace(final, budget=budget)
            return final, ""
        first_failure = first_failure or failure
    why = f"{path} ({version_line}) cannot confine here: {first_failure}"
    lowered = (first_failure or "").lower()
    signs = ("namespace", "uid map", "operation not permitted", "permission denied")
    if any(sign in lowered for sign in signs):
        why += NAMESPACE_HINT
    return None, why
