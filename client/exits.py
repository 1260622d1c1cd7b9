"""How a failed ``dsh`` command ends: one stderr line and an exit status, shared by every
command (``client.cli``) and ``dsh chat`` (``client.chat``).

Theory of operation: trio nurseries wrap failures in exception groups; :func:`single` digs out
the exception that says what happened. :func:`exit_for` maps it to a status after writing its
line through the caller's ``note``; it returns None for anything it does not know (a bug: the
caller re-raises it with its traceback).
"""

from __future__ import annotations

from typing import Callable

from client.api import CallLost, DaemonNotRunning, DaemonUnresponsive
from client.transport import DshClientError
from protocol.rpc import RpcError

EXIT_ERROR = 1
EXIT_DAEMON_NOT_RUNNING = 2
EXIT_OUTCOME_UNKNOWN = 75  # EX_TEMPFAIL: the command may or may not have run
EXIT_TIMEOUT = 124
EXIT_NEVER_RAN = 125
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


def leaves(exc: BaseException):
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def single(exc: BaseException) -> BaseException:
    """The exception that says what happened, out of nested exception groups (trio nurseries):
    the one leaf, or -- when several tasks failed at once, e.g. all of them on the connection
    dshd closed -- the first interrupt, then lost call, client error, error answer, broken pipe.
    Anything else stays the group (a bug: re-raised with its traceback)."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    found = list(leaves(exc))
    if len(found) == 1:
        return found[0]
    for kind in (KeyboardInterrupt, CallLost, DshClientError, RpcError, BrokenPipeError):
        for leaf in found:
            if isinstance(leaf, kind):
                return leaf
    return exc


def exit_for(exc: BaseException, note: Callable[[str], None]) -> int | None:
    """Write the line for ``exc`` (already :func:`single`) and return its exit status."""
    if isinstance(exc, DaemonNotRunning):
        note(str(exc))
        return EXIT_DAEMON_NOT_RUNNING
    if isinstance(exc, DaemonUnresponsive):
        note(f"dsh: {exc}")
        return EXIT_DAEMON_NOT_RUNNING
    if isinstance(exc, DshClientError):
        note(f"dsh: {exc}")
        if isinstance(exc, CallLost):
            note(f"dsh: {exc.hint}")
            return EXIT_OUTCOME_UNKNOWN  # the call may or may not have finished
        return EXIT_ERROR
    if isinstance(exc, RpcError):
        note(f"dsh: {exc.message}")
        return EXIT_ERROR
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return None
