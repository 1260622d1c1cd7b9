"""Every exit status of ``dsh``: how a call's result, a turn, a failure or a check ends the
command (docs/README.md, "`dsh` exit status").

Theory of operation: the commands (``client.cli``) decide nothing about statuses themselves;
they ask here. :func:`exit_status` maps a ToolResult to a status and its stderr line;
:func:`turn_status` a turn's end reason (``dsh chat``); :func:`failure_status` an exception
that ended a command: anyio task groups wrap failures in exception groups, so :func:`single`
first digs out the exception that says what happened, then its line goes through the caller's
``note``. It returns None for anything it does not know (a bug: the caller re-raises it with
its traceback). :func:`detached_status`, :func:`fsck_status` and :func:`decided_status` name
the remaining cases.

:data:`EXIT_TABLE` is the one exit-status table: each status with its meaning, the source of
``dsh help exit-codes``, of README.md's "`dsh` exit status" section (``dsh help exit-codes
--markdown``; tests/test_docs.py compares the two) and of the man page's EXIT STATUS. A new
``EXIT_*`` constant without a row fails that test.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from client.api import CallLost, DaemonGone, DaemonNotRunning, DaemonUnresponsive
from client.spill import command_ran
from client.transport import DshClientError
from protocol.lane import ToolResult
from protocol.rpc import RpcError

__all__ = ["exit_status", "turn_status", "unanswered_status", "failure_status",
           "detached_status", "fsck_status",
           "single", "leaves", "NEVER_RAN_CODES"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_DAEMON_NOT_RUNNING = 2
EXIT_OUTCOME_UNKNOWN = 75  # EX_TEMPFAIL: the command may or may not have run
EXIT_TIMEOUT = 124
EXIT_NEVER_RAN = 125
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

#: The exit-status table (module doc): (the statuses of a row, its meaning), in the order shown.
#: ``None`` stands for "N", the command's own exit code. Markdown code spans are kept in the
#: text (README.md); ``dsh help exit-codes`` prints them without the backticks.
EXIT_TABLE: tuple[tuple[tuple[int, ...] | None, str], ...] = (
    ((EXIT_OK,), "success (`dsh run`, `dsh wait`: the command exited 0 and the call is not an "
                 "error); `dsh run -t` / `dsh attach`: detached with the detach keys (the "
                 "command keeps running)"),
    (None, "`dsh run` / `dsh wait` / `dsh attach --call`: the command's exit code (128+signal "
           "when a signal killed it)"),
    ((EXIT_ERROR,), "a request refused by dshd (an error answer), any other `errorCode` with "
                    "exit code 0; `dsh cancel`: the call was not running; `dsh fsck`: a "
                    "session is damaged; `dsh chat`: the turn ended in an error or was "
                    "interrupted"),
    ((EXIT_DAEMON_NOT_RUNNING,), "dshd is not running or does not answer `initialize` in time "
                                 "(`DSH_CONNECT_TIMEOUT`, default 10 s); a usage error"),
    ((EXIT_OUTCOME_UNKNOWN,), "`TOOL_OUTCOME_UNKNOWN`: the call's host died with dshd (HOST.md "
                              "§7), or `dsh run` / `dsh attach` / `dsh wait` lost dshd and it "
                              "did not come back within `--reconnect-timeout` (default 30 s; 0: "
                              "at once; or within what was left of it, when outages less than "
                              "5 s apart share it); it may or may not have run (`dsh wait "
                              "SESSION CALL` tells after a restart)"),
    ((EXIT_TIMEOUT,), "`TOOL_TIMEOUT` (`dsh run --timeout`); `dsh wait --timeout` expired "
                      "before the result (the call goes on)"),
    ((EXIT_NEVER_RAN,), "the call never ran (`APPROVAL_*`, `SANDBOX_UNAVAILABLE`, "
                        "`STORAGE_FAILURE`, `ABORTED_BEFORE_DISPATCH`, `TOOL_NOT_STARTED`, or "
                        "an `errorCode` without an exit code); `dsh chat`: a call of the turn "
                        "needed approval and no one could be asked (no terminal, no `--yes`)"),
    ((EXIT_INTERRUPTED,), "`TOOL_CANCELLED` with exit code 0 (otherwise the command's own "
                          "code); Ctrl-C (detached, or `--cancel-on-interrupt`); `dsh chat`: "
                          "the turn was cancelled"),
    ((EXIT_BROKEN_PIPE,), "stdout was closed (a broken pipe)"),
    ((128 + 1, 128 + 15), "`dsh run` / `dsh attach` detached because dsh itself got SIGHUP / "
                          "SIGTERM (the terminal restored; the command keeps running)"),
)
EXIT_TABLE_NOTE = "A call that is an error never exits 0."
__all__ += ["EXIT_TABLE", "EXIT_TABLE_NOTE"]

#: errorCodes of a call that never ran (exit 125 whatever else the result says).
NEVER_RAN_CODES = frozenset({
    "STORAGE_FAILURE", "SANDBOX_UNAVAILABLE", "APPROVAL_REJECTED", "APPROVAL_UNAVAILABLE",
    "APPROVAL_CANCELLED", "ABORTED_BEFORE_DISPATCH", "TOOL_NOT_STARTED",
})
#: ``dsh chat``: the status for each ``turn/end`` reason.
TURN_STATUS = {"completed": EXIT_OK, "error": EXIT_ERROR, "interrupted": EXIT_ERROR,
               "cancelled": EXIT_INTERRUPTED}


# ---------------------------------------------------------------------- results
def _exit_code(result: ToolResult) -> int | None:
    """The command's exit code: the result's own, else the one in ``details``."""
    return result.exit_code if result.exit_code is not None else result.details.exit_code


def _sentence(result: ToolResult) -> str:
    sentence = result.message  # dshd's sentence when content holds output
    if sentence is None and result.error_code == "TOOL_OUTCOME_UNKNOWN":
        # Its content is the sentence, then maybe the last output checkpointed.
        sentence = result.content.split("\n\n", 1)[0]
    elif sentence is None:
        sentence = "" if command_ran(result) else result.content
    return sentence.strip()


def exit_status(result: ToolResult) -> tuple[int, str | None]:
    """The exit status of ``dsh`` for a ToolResult, and a line for stderr (or None).

    TOOL_TIMEOUT: 124. TOOL_CANCELLED: the command's exit code if non-zero, else 130.
    TOOL_OUTCOME_UNKNOWN (dshd crashed while it ran: it may or may not have run): 75. A code of
    ``NEVER_RAN_CODES``: 125. Another errorCode: the exit code if non-zero, else 1 -- or 125
    when there is none (the call never ran). The ``errorCode`` and sentence go to stderr. No
    errorCode: the exit code (1 when there is none and the result is an error). Never 0 for a
    result with ``isError``.
    """
    error_code = result.error_code
    code = _exit_code(result)
    sentence = _sentence(result)
    line = (f"dsh: {error_code}: {sentence}" if sentence else f"dsh: {error_code}") \
        if error_code else None
    own = max(0, min(code, 255)) if code is not None else None  # what the command exited with
    if error_code == "TOOL_TIMEOUT":
        status = EXIT_TIMEOUT
    elif error_code == "TOOL_CANCELLED":
        status = own or EXIT_INTERRUPTED
    elif error_code == "TOOL_OUTCOME_UNKNOWN":
        status = EXIT_OUTCOME_UNKNOWN
    elif error_code in NEVER_RAN_CODES:
        status = EXIT_NEVER_RAN
    elif error_code:
        status = EXIT_NEVER_RAN if own is None else own or EXIT_ERROR
    else:
        status = own if own is not None else EXIT_OK
    if status == EXIT_OK and (error_code or result.is_error):
        status = EXIT_ERROR
    return status, line


def turn_status(reason: Any) -> int:
    """``dsh chat``: 0 completed, 130 cancelled, 1 for an error or anything else."""
    return TURN_STATUS.get(reason, EXIT_ERROR) if isinstance(reason, str) else EXIT_ERROR


def unanswered_status(status: int) -> int:
    """``dsh chat``: a call needed approval and no one could be asked (stdin ended: no terminal,
    no ``--yes``): 125, the status of a call that never ran, whatever the turn's own status
    (``status``) -- but a cancelled turn stays 130."""
    return status if status == EXIT_INTERRUPTED else EXIT_NEVER_RAN


def detached_status(pipe: bool) -> int:
    """``dsh run`` stopped following before the result: 141 for a closed stdout, else 130."""
    return EXIT_BROKEN_PIPE if pipe else EXIT_INTERRUPTED


def fsck_status(failed: bool) -> int:
    """``dsh fsck``: 1 when any session is damaged or unchecked."""
    return EXIT_ERROR if failed else EXIT_OK


def decided_status(*, already: bool) -> int:
    """``dsh approve``: 1 when the request was decided already (or ``dsh cancel``: not
    running), else 0."""
    return EXIT_ERROR if already else EXIT_OK


# ---------------------------------------------------------------------- failures
def leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def single(exc: BaseException) -> BaseException:
    """The exception that says what happened, out of nested exception groups (task groups):
    the one leaf, or -- when several tasks failed at once, e.g. all of them on the connection
    dshd closed -- the first interrupt, then lost call, client error, error answer, broken pipe.
    Anything else stays the group (a bug: re-raised with its traceback)."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    found = list(leaves(exc))
    if len(found) == 1:
        return found[0]
    for kind in (KeyboardInterrupt, CallLost, DaemonGone, DshClientError, RpcError,
                 BrokenPipeError):
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
        if isinstance(exc, DaemonGone):
            return EXIT_OUTCOME_UNKNOWN  # what it waited for may or may not have happened
        return EXIT_ERROR
    if isinstance(exc, RpcError):
        note(f"dsh: {exc.message}")
        return EXIT_ERROR
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return None


def failure_status(raised: BaseException, note: Callable[[str], None],
                   on_broken_pipe: Callable[[], None]) -> int | None:
    """The status for an exception that ended a command (None: a bug, re-raise it). A closed
    stdout is 141, after ``on_broken_pipe`` (which keeps the final flush quiet)."""
    exc = single(raised)
    if isinstance(exc, BrokenPipeError):
        on_broken_pipe()
        return EXIT_BROKEN_PIPE
    return exit_for(exc, note)


def run_status(status: int, *, cancelled_by_user: bool) -> int:
    """``dsh run``: the result's status, or 130 when Ctrl-C cancelled the call."""
    return EXIT_INTERRUPTED if cancelled_by_user else status
