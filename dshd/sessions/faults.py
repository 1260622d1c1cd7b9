"""Test hook: a crash injected into a session's tasks, for the supervision tests.

Theory of operation: ``DSH_TEST_FAULT=KIND:TOKEN`` is read once, by the session registry, when
the daemon starts, and handed to every session; unset or empty it does nothing (a daemon that
has one logs ``test_fault.enabled``). ``publish-crash:TOKEN`` raises :class:`InjectedFault` in
the publisher task while a running call's command contains TOKEN; ``settle-crash:TOKEN`` in the
task of such a call while it moves its settled result onto the lane. Both let the tests see a
session crash and wind down honestly (``dshd.sessions.session``: supervision).
``delete-kill:TOKEN`` SIGKILLs the daemon mid-delete of a session whose cwd contains TOKEN
(between the tombstone rename and the removal); ``mint-id:ID`` makes ID the first id
``mint_session_id`` tries (a forced collision with a deleted id). Both are the registry's.
"""

from __future__ import annotations

from dataclasses import dataclass


class InjectedFault(RuntimeError):
    """The exception ``DSH_TEST_FAULT`` injects (a test hook, see ``TestFault``)."""


@dataclass(frozen=True)
class TestFault:
    """A crash to inject for tests (``DSH_TEST_FAULT=KIND:TOKEN``, read once by the registry at
    daemon start; inert when unset): ``publish-crash:TOKEN`` raises in the publisher task while
    a running call's command contains TOKEN, ``settle-crash:TOKEN`` in the task of such a call
    while it moves its settled result onto the lane."""

    __test__ = False  # not a pytest class
    KINDS = ("publish-crash", "settle-crash", "delete-kill", "mint-id")
    kind: str
    token: str

    @classmethod
    def parse(cls, value: str | None) -> TestFault | None:
        """None for unset/empty; ValueError naming the format otherwise."""
        if not value:
            return None
        kind, sep, token = value.partition(":")
        if kind not in cls.KINDS or not sep or not token:
            raise ValueError(
                f"DSH_TEST_FAULT={value!r}: expected KIND:TOKEN with KIND one of {cls.KINDS}"
            )
        return cls(kind, token)

    def hits(self, kind: str, calls) -> bool:
        return self.kind == kind and any(
            self.token in str(call.arguments.get("command", "")) for call in calls
        )
