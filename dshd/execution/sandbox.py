"""Sandbox providers: ``confine(argv, mode, workspace) -> (argv', completeness)`` (EXEC.md §3).

Theory of operation
-------------------
A *provider* turns a ready-to-exec argv into one that runs the same command confined, and says
how complete that confinement is. :func:`probe` picks one provider at daemon start; the daemon
keeps it for its lifetime and reports :meth:`Provider.describe` in ``initialize`` and
``daemon.status``. Confining rewrites argv (and opens the fds the new argv refers to: the
pinned workspace, a tmpfs lease): nothing is spawned by ``confine`` itself, and the wrapped
argv is what :func:`dshd.execution.hosted.run_hosted` hands to the call's host.

This module is the probe and the one place the daemon imports sandbox names from; the parts
live by job: :mod:`.confine` (modes, the :class:`Provider` interface, the verdict,
:class:`NoSandbox`), :mod:`.workspace` (pinning and the checks before confining),
:mod:`.tmp_budget` (:class:`TmpBudget`), :mod:`.self_test` (the probe's real commands), and the
providers :mod:`.sandbox_bwrap` and :mod:`.sandbox_landlock`.

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

from pathlib import Path

from dshd.execution.confine import (
    CONFINING_MODES,
    MODES,
    NoSandbox,
    Provider,
    SandboxUnavailable,
    Verdict,
    check_mode,
)
from dshd.execution.sandbox_bwrap import probe_bwrap
from dshd.execution.sandbox_landlock import probe_landlock
from dshd.execution.self_test import PROBE_TIMEOUT, self_test
from dshd.execution.tmp_budget import DEFAULT_TMP_SIZE, DEFAULT_TMP_TOTAL, TmpBudget
from dshd.execution.workspace import (
    HiddenPathGuard,
    PinnedWorkspace,
    check_confinable,
    close_fds,
    pin_workspace,
    refused_workspace,
)

__all__ = [
    "CONFINING_MODES",
    "DEFAULT_TMP_SIZE",
    "DEFAULT_TMP_TOTAL",
    "HiddenPathGuard",
    "MODES",
    "NoSandbox",
    "PROBE_TIMEOUT",
    "Provider",
    "SandboxUnavailable",
    "TmpBudget",
    "PinnedWorkspace",
    "Verdict",
    "check_confinable",
    "check_mode",
    "close_fds",
    "pin_workspace",
    "probe",
    "refused_workspace",
    "self_test",
]


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
