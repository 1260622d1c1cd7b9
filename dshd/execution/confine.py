"""What confining means to dshd: the modes, the provider interface, the verdict (EXEC.md §3).

Theory of operation: a *provider* turns a ready-to-exec argv into one that runs the same
command confined (``confine(argv, mode, workspace) -> (argv', completeness)``), and says how
complete that confinement is. This module holds what every provider shares and nothing that
does I/O: the modes (:data:`MODES`; ``danger-full-access`` is never confined), the
:class:`Provider` interface the daemon holds, :class:`SandboxUnavailable` (the one refusal,
reported as ``SANDBOX_UNAVAILABLE``), :class:`Verdict` (the ``describe()`` that ``initialize``
and ``daemon.status`` show) and :class:`NoSandbox`, the provider that confines nothing and so
refuses every confining mode. The real providers are :mod:`.sandbox_bwrap` and
:mod:`.sandbox_landlock`; :mod:`.sandbox` picks one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["CONFINING_MODES", "MODES", "NoSandbox", "Provider", "SandboxUnavailable", "Verdict",
           "check_mode", "skipped_list"]

#: Every sandbox mode (EXEC.md §3).
MODES = ("read-only", "workspace-write", "danger-full-access")
#: The modes a provider must actually confine.
CONFINING_MODES = ("read-only", "workspace-write")


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
        (``run_hosted(pass_fds=...)`` does both). The bwrap provider requires it.

        ``hide``: paths the tool must not see (the daemon's state directory, its socket).
        ``network``: allow the network in ``workspace-write``. ``danger-full-access`` gives
        ``(argv, "none")``. Raises :class:`SandboxUnavailable` (provider ``none``) or
        ``ValueError`` (unknown mode, relative workspace).
        """
        ...


def check_mode(mode: str, workspace: str) -> None:
    """Raise ``ValueError`` for an unknown mode or a relative workspace path."""
    if mode not in MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}; expected one of {', '.join(MODES)}")
    if not os.path.isabs(workspace):
        raise ValueError(f"the workspace must be an absolute path, not {workspace!r}")


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
