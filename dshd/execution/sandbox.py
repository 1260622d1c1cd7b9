"""Sandbox providers: ``confine(argv, mode, workspace) -> (argv', completeness)`` (EXEC.md §3).

Theory of operation: a provider is probed once at daemon start; the verdict is reported by
``initialize`` and ``daemon.status``. This module holds the provider interface and the
``none`` provider, which changes nothing and reports completeness ``none``.
"""

from __future__ import annotations

from dataclasses import dataclass


class SandboxUnavailable(Exception):
    """No usable sandbox for the mode: nothing is spawned."""


@dataclass(frozen=True)
class NoSandbox:
    """Provider ``none``: argv unchanged, completeness ``none``."""

    name: str = "none"
    completeness: str = "none"
    reason: str = "no sandbox provider is configured yet"

    def confine(self, argv: list[str], mode: str, workspace: str, *, hide=(), network=False) -> tuple[list[str], str]:
        return list(argv), "none"

    def describe(self) -> dict:
        return {"provider": self.name, "completeness": self.completeness, "reason": self.reason}
