"""The ``landlock`` sandbox provider: LSM rules, completeness ``partial`` (EXEC.md §3).

Theory of operation
-------------------
Landlock restricts the thread that asks for it and everything that thread later runs, so the
daemon cannot confine a child from outside. ``confine`` therefore wraps ``argv`` in the
launcher :mod:`dshd.execution.landlock_exec`::

    <python> -I -S .../landlock_exec.py --rules-json '{...}' -- argv...

which, inside the spawned process (the process-group leader the daemon kills on cancel),
builds a ruleset for the kernel's ABI, sets ``no_new_privs``, drops capabilities, restricts
itself and ``execvp``\\ s the command. The rules:

=============================== ===========================================================
path                            rights
=============================== ===========================================================
``/``                           execute, read file, read directory (everything else denied)
workspace (``workspace-write``) every right of the ABI (create, remove, rename within, …),
                                on the pinned fd the launcher inherits (read-only: read rights)
per-call ``TMPDIR``             every right; ``<scratch>/landlock-tmp/<pgid>-<random>``
``/dev/null`` ``/dev/zero`` …   read, write, truncate, ioctl
TCP (ABI ≥ 4)                   bind and connect denied unless the network is allowed
scopes (ABI ≥ 6)                abstract Unix sockets and signals confined to the sandbox
seccomp (every ABI)             ``socket(AF_UNIX)`` refused; with the network off only TCP
                                sockets (no UDP/DNS/ICMP/SCTP) and netlink; no io_uring
=============================== ===========================================================

Landlock has no rule for UDP or for connecting to a pathname Unix socket (a later ABI's
Unix-socket right is not in this kernel's ABI 7), so the launcher adds a seccomp filter
(:func:`dshd.execution.landlock_exec.socket_filter`): a confined tool cannot drive dshd
through its socket — at whatever path it guesses — nor D-Bus, systemd or docker, and sends no
datagram while the network is off. The price: a tool cannot use any Unix socket, not even one
it serves itself in the workspace (bwrap allows that).

The workspace is pinned by fd (:func:`dshd.execution.sandbox.pin_workspace`) and the checks
run on the fd's path; the launcher inherits the fd (``"workspace": {"fd", "path", "dev", "ino",
"write"}`` in the rules), checks its identity, ``fchdir``\\ s to it and puts the workspace rule on
it — no path is looked up again, so a rename-for-a-symlink race cannot move the rule elsewhere.
Without an fd (a caller that passes no ``fds``) the launcher opens the path and refuses
(exit 126, naming it) when the directory found is not the one dshd checked.

Refused here, because Landlock cannot hide: ``workspace-write`` when dshd's state directory or
socket lies inside the workspace (a rule cannot allow a tree *except* part of it), with
``SANDBOX_UNAVAILABLE``; ``read-only`` such a session still runs (it reads the state, below).

Why ``partial`` always — what Landlock cannot do that bwrap does:

* **hide** nothing: a rule can only *allow* beneath a path, so inside the readable ``/`` the
  daemon's state directory (other sessions' logs and spill files) stays readable;
* **metadata**: Landlock does not cover ``chmod``, ``chown``, ``utime`` or extended
  attributes, so a tool can change the mode or times of files outside the workspace that its
  user owns (for a root daemon: most of the system; capabilities are dropped, ownership is not);
* **no private /tmp**: the rest of ``/tmp`` is read-only and ``TMPDIR`` points at a per-call
  directory (tools that hard-code ``/tmp`` get ``EACCES``); ``/dev/shm`` is not writable, so
  POSIX shared memory (Python ``multiprocessing`` locks) fails;
* network: Landlock itself rules TCP only (ABI ≥ 4); the seccomp filter above does the rest
  by refusing whole socket kinds, it cannot judge addresses;
* no pid namespace: a process that ``setsid``\\ s can outlive a cancel.

Per-call temporary directories are removed by a later launch once their process group is gone
(see :func:`dshd.execution.landlock_exec.collect_garbage`), and by :func:`probe_landlock`.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import trio

from dshd.execution import landlock_exec
from dshd.execution.confine import SandboxUnavailable, Verdict, check_mode
from dshd.execution.self_test import self_test
from dshd.execution.workspace import HiddenPathGuard, check_confinable, pin_workspace

__all__ = ["DEVICES", "LandlockProvider", "probe_landlock"]

#: Device files a confined command may read and write (missing ones are skipped).
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


@dataclass(frozen=True)
class LandlockProvider(Verdict):
    """Provider ``landlock`` (see the module doc). ``abi``: the kernel's Landlock ABI;
    ``python``: interpreter for the launcher; ``launcher``: path of ``landlock_exec.py``;
    ``tmp_root``: parent of the per-call ``TMPDIR`` directories."""

    abi: int
    python: str
    launcher: str
    tmp_root: str
    reason: str = ""
    skipped: tuple[tuple[str, str], ...] = field(default=())
    name: str = "landlock"
    completeness: str = "partial"
    guard: HiddenPathGuard = field(default_factory=HiddenPathGuard, compare=False, repr=False)

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
        """``(launcher argv, "partial")``; ``danger-full-access`` → ``(argv, "none")``.

        ``hide`` cannot be masked (the reason says so; completeness stays ``partial``), so
        ``workspace-write`` is refused with :class:`SandboxUnavailable` when a hidden path lies
        inside the workspace (a rule cannot allow a tree *except* a part of it: the tool could
        write the state directory or rename it away). ``network``: honoured in
        ``workspace-write`` only. Raises ``ValueError`` for an unknown mode or a relative
        workspace, :class:`SandboxUnavailable` for a refused workspace or a moved hidden path.
        ``workspace`` is pinned (:func:`pin_workspace`) and checked on the fd's path; the
        launcher receives that path with its ``(st_dev, st_ino)``, and refuses to run when its
        own open finds another directory there. ``fds``: when given, receives the pinned
        fd, which the launcher inherits and uses instead of opening the path again.
        """
        check_mode(mode, workspace)
        if mode == "danger-full-access":
            check_confinable(mode, workspace, list(hide), self.guard)
            return list(argv), "none"
        # Pinned: checked on the fd's own path. With ``fds`` the launcher inherits the fd itself
        # (puts its rule on it and fchdirs to it); without, it gets the path and the identity
        # and checks its own open against them (a swapped path fails closed, exit 126).
        pinned = pin_workspace(workspace)
        try:
            ws = pinned.path
            check_confinable(mode, ws, list(hide), self.guard)
            self._refuse_hidden_inside(mode, ws, hide)
        except BaseException:
            os.close(pinned.fd)
            raise
        spec = {"path": ws, "dev": pinned.dev, "ino": pinned.ino,
                "write": mode == "workspace-write"}
        if fds is not None:
            fds.append(pinned.fd)
            spec["fd"] = pinned.fd
        else:
            os.close(pinned.fd)
        rules = {
            "read": ["/"],
            "write": [],
            "workspace": spec,
            "devices": list(DEVICES),
            "tmp_root": self.tmp_root,
            "deny_tcp": not (network and mode == "workspace-write"),
        }
        wrapped = [
            self.python, "-I", "-S", self.launcher,
            "--rules-json", json.dumps(rules, separators=(",", ":")),
            "--", *argv,
        ]
        return wrapped, self.completeness

    @staticmethod
    def _refuse_hidden_inside(mode: str, ws: str, hide: list[str]) -> None:
        if mode != "workspace-write":
            return
        for path in hide:
            real = os.path.realpath(path)
            if os.path.commonpath([real, ws]) == ws:
                raise SandboxUnavailable(
                    f"Landlock cannot keep tools out of {path} (dshd's state directory or "
                    f"socket), which lies inside the workspace {ws}: a workspace-write tool "
                    "could read, change or move it. Use a project directory as the "
                    "session directory, read-only mode, or install bubblewrap (bwrap)."
                )


def _unavailable(err: int) -> str:
    if err == errno.ENOSYS:
        return "this kernel has no Landlock (needs Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK)"
    if err == errno.EOPNOTSUPP:
        return "Landlock is built but not enabled; add landlock to the lsm= boot parameter"
    if err == errno.EPERM:
        return "the Landlock syscalls are refused (a seccomp filter, e.g. a container profile)"
    return f"the Landlock ABI query failed ({os.strerror(err)})"


def _limits(abi: int) -> str:
    parts = ["the state directory and other hidden paths stay readable",
             "metadata changes (chmod, chown, utime, xattrs) outside the workspace are not "
             "blocked",
             "/tmp is not private (TMPDIR is) and /dev/shm is not writable"]
    if abi < 4:
        parts.append(f"ABI {abi} < 4 has no TCP rules, so with the network off the seccomp "
                     "filter refuses every IP socket")
    parts.append("TCP bind/connect are denied by Landlock and UDP by seccomp when the network "
                 "is off" if abi >= 4 else "")
    parts.append("Unix sockets are refused outright by a seccomp filter (socket(AF_UNIX) → "
                 "EPERM: tools cannot reach dshd, D-Bus, systemd or docker, nor serve a Unix "
                 "socket of their own), and so are 32-bit syscalls")
    if abi < 6:
        parts.append("abstract Unix sockets and signals are not scoped (ABI < 6)")
    parts.append("there is no pid namespace, so a setsid'd process can outlive a cancel")
    return "; ".join(part for part in parts if part)


async def probe_landlock(
    scratch_dir: Path, python: str | None, skipped: tuple[tuple[str, str], ...]
) -> tuple[LandlockProvider | None, str]:
    """``(provider, "")`` when Landlock confines here, else ``(None, why not)`` (EXEC.md §3).

    Queries the ABI in the daemon (no restriction of the daemon itself), then runs the real
    probe commands through the launcher. ``python``: interpreter for the launcher (default
    ``sys.executable``). ``skipped``: carried into ``describe()``.
    """
    abi, err = landlock_exec.landlock_abi()
    if abi < 1:
        return None, _unavailable(err)
    tmp_root = Path(scratch_dir) / "landlock-tmp"
    tmp_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    provider = LandlockProvider(
        abi=abi,
        python=python or sys.executable,
        launcher=os.path.realpath(landlock_exec.__file__),
        tmp_root=str(tmp_root),
        skipped=skipped,
    )
    failure = await self_test(provider, Path(scratch_dir))
    await trio.to_thread.run_sync(landlock_exec.collect_garbage, str(tmp_root), 10_000)
    if failure is not None:
        return None, f"Landlock ABI {abi}: {failure}"
    used = min(abi, landlock_exec.KNOWN_ABI)
    reason = (
        f"Landlock ABI {abi}{f' (used as ABI {used})' if used != abi else ''}: writes only in "
        f"the workspace and a per-call TMPDIR under {tmp_root}, no capabilities; partial: "
        f"{_limits(abi)}; probe: a confined `true` ran and a write outside the workspace was "
        "refused"
    )
    if skipped:
        reason += "; skipped " + ", ".join(f"{n} ({why})" for n, why in skipped)
    return (
        LandlockProvider(
            abi=provider.abi,
            python=provider.python,
            launcher=provider.launcher,
            tmp_root=provider.tmp_root,
            reason=reason,
            skipped=skipped,
        ),
        "",
    )
