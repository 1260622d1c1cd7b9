"""The ToolResult of a tool call, built in one place (PROTOCOL.md §3.2, EXEC.md §1).

Theory of operation: every result has ``details.truncation`` (zeros for a call that never ran,
else the capture's). A call that never started (:func:`failed_result` without a capture) has
its sentence as the content; one that ran has its output as the content and the sentence as
``message``. A command's outcome (:func:`outcome_result`) is an error when its exit code is
not 0 or it timed out, was cancelled or failed (a timeout's or a cancel's ``error``, a call
host killed for not answering, is added to its ``message``); the sandbox's note says when
confinement was partial. A call settled from the exit record of a host whose command ended
while no daemon ran -- its ``endedAt`` before this daemon started (:func:`while_down_note`) --
carries :data:`FINISHED_WHILE_DOWN` in its ``message`` (HOST.md §7); one that ended after the
start, before the daemon re-attached, carries no note: nothing of it was missed.
"""

from __future__ import annotations

import msgspec

from protocol.lane import SandboxNote, ToolResult, ToolResultDetails, Truncation

from ..config import Config
from ..execution.capture import OutputCapture
from ..execution.hosted import ExecOutcome
from ..results import sentence

#: The note of a result settled from its host's exit record after a restart (HOST.md §7).
FINISHED_WHILE_DOWN = ("dshd was not running when the command ended (or lost its record of the "
                       "end); its output and exit code were recorded by its call host")


def while_down_note(exit_record: dict | None, since: float) -> str | None:
    """:data:`FINISHED_WHILE_DOWN` when the exit record says the command ended before
    ``since`` (Unix time this daemon started) or does not say when; None when it ended while
    this daemon ran (re-attaching to its host, or its session not yet open) or has not ended."""
    if exit_record is None:
        return None
    ended = exit_record.get("endedAt")
    if isinstance(ended, (int, float)) and not isinstance(ended, bool) and ended >= since:
        return None
    return FINISHED_WHILE_DOWN


def zero_truncation(config: Config) -> Truncation:
    """``details.truncation`` of a call that wrote nothing (or never ran)."""
    return Truncation(max_bytes=config.output_max_bytes, max_lines=config.output_max_lines)


def failed_result(config: Config, call_id: str, code: str, text: str,
                  capture: OutputCapture | None = None) -> ToolResult:
    """A failed ToolResult: ``text`` is the content when the command never started
    (``capture`` None), else the ``message`` next to its output."""
    if capture is None:
        return ToolResult(call_id, True, text, ToolResultDetails(zero_truncation(config)),
                          error_code=code)
    details = ToolResultDetails(msgspec.convert(capture.truncation, Truncation),
                                spill_path=capture.spill_path or None)
    return ToolResult(call_id, True, capture.text, details, error_code=code, message=text)


def outcome_result(call_id: str, arguments: dict, capture: OutputCapture,
                   outcome: ExecOutcome, completeness: str, sandbox_name: str,
                   stopping: bool, note: str | None = None) -> ToolResult:
    """The ToolResult of a command that ran (its owner's outcome); ``stopping``: a cancel
    came from the session's stop; ``note``: a sentence added to ``message``."""
    details = ToolResultDetails(msgspec.convert(capture.truncation, Truncation),
                                spill_path=capture.spill_path or None,
                                exit_code=outcome.exit_code)
    if completeness != "full":
        details.sandbox = SandboxNote(sandbox_name, completeness)
    result = ToolResult(
        call_id,
        bool(outcome.exit_code != 0 or outcome.error or outcome.timed_out or outcome.cancelled),
        capture.text, details, exit_code=outcome.exit_code)
    if outcome.timed_out:
        result.error_code = "TOOL_TIMEOUT"
        result.message = sentence("TOOL_TIMEOUT", timeout=arguments.get("timeout"))
    elif outcome.cancelled:
        result.error_code = "TOOL_CANCELLED"
        result.message = sentence("TOOL_CANCELLED", "shutdown" if stopping else "")
    elif outcome.error:
        result.error_code = "TOOL_FAILED"
        result.message = sentence("TOOL_FAILED", error=outcome.error)
    if (outcome.timed_out or outcome.cancelled) and outcome.error:
        result.message = f"{result.message} ({outcome.error})"  # a host killed for not answering
    if note:
        result.message = f"{result.message} ({note})" if result.message else note
    return result
