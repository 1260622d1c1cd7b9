"""How following one call ends on the terminal: the closing notes of a settled call (what of
its output was not shown, and why), its exit status (``client.exits``), or -- when dsh left
the call running -- the line saying so and how to re-attach.
"""

from __future__ import annotations

from client.cli.callstate import Call, Detach, Followed, Io
from client.cli.keys import describe_keys
from client.cli.terminal import emit_bytes, note, silence_stdout
from client.exits import detached_status, exit_status
from client.spill import command_ran
from protocol.lane import ToolResult

__all__ = ["reattach_hint", "detach_note", "left_early", "detach_exit", "end_notes",
           "result_status"]


def reattach_hint(call: Call) -> str:
    return f"dsh attach {call.session_id} --call {call.call_id}"


def detach_note(call: Call, followed: Followed, io: Io) -> None:
    """The one line saying we left the call running, and how to come back."""
    how = followed.detached
    if followed.waiting:
        note(f"detached; the call still waits for approval {followed.waiting} (`dsh approve "
             f"{call.session_id} {followed.waiting}`). Re-attach: {reattach_hint(call)}")
        return
    if how is not None and how.why == "pipe":
        note(f"dsh: stdout was closed; detached, the command keeps running. Re-attach: "
             f"{reattach_hint(call)}; cancel: dsh cancel {call.session_id} {call.call_id}")
        return
    why = f" ({describe_keys(io.detach_keys)})" if how is not None and how.why == "keys" else ""
    note(f"detached{why}; the command keeps running. Re-attach: {reattach_hint(call)}")


def left_early(call: Call, followed: Followed, io: Io) -> int | None:
    """When we left the call running (detached, or no result): say so, and the status; else
    None (the call ended and its result is in ``followed``)."""
    if followed.detached is None and followed.result is not None:
        return None
    detach_note(call, followed, io)
    if followed.detached is not None and followed.detached.why == "pipe":
        silence_stdout()
    return detach_exit(followed.detached)


def detach_exit(detached: Detach | None) -> int:
    """The status of a ``dsh run`` that left its call running (``KEYS_RULE``)."""
    if detached is None or detached.why == "interrupt":
        return detached_status(False)
    if detached.why == "pipe":
        return detached_status(True)
    if detached.why == "keys":
        return 0
    return 128 + detached.signum


def end_notes(followed: Followed, result: ToolResult) -> None:
    """After the output: what of it was not shown, and why. The result's ``totalBytes`` (the
    bytes the command wrote) is the check: a raw log that ended short is said, and one that is
    missing altogether (nothing printed) is replaced by the call's window."""
    state = followed.output
    truncation = result.details.truncation
    total = truncation.total_bytes if truncation is not None else 0
    short = command_ran(result) and state.position < total
    no_log = command_ran(result) and state.position == 0 and state.dropped == 0 \
        and (short or state.error is not None)
    if no_log and result.content:
        emit_bytes(result.content.encode("utf-8", "replace"))  # the window, at least
        note(f"dsh: the raw output is not available ({state.error or 'its log is missing'});"
             " the call's window (its last lines, cleaned) was shown instead")
    elif short:
        note(f"dsh: {total - state.position} of {total} bytes of output were not shown: the "
             f"raw output ended at byte {state.position}"
             + (f" ({state.error})" if state.error else ""))
    elif state.error is not None and command_ran(result):
        note(f"dsh: the output may be incomplete: {state.error}")
    if state.gaps > 1 or (state.dropped and state.gaps == 0):
        note(f"dsh: {state.dropped} bytes of the output in all were dropped by the per-call "
             "disk cap (spill_max_bytes)")


def result_status(followed: Followed) -> int:
    """Print the closing lines of a settled call; its exit status (``client.exits``)."""
    assert followed.result is not None
    end_notes(followed, followed.result)
    status, message = exit_status(followed.result)
    if message:
        note(message)
    return status
