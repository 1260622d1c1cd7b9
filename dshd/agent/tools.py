"""The tools a model may call: their schemas, their concurrency, their argument checks.

Theory of operation: ``TOOLS`` is plain data. Each :class:`ToolSpec` gives the JSON schema the
model sees, whether calls of it may run at the same time as their neighbours (``concurrent``;
a tool that only reads would say so), and a check that turns the model's raw JSON arguments
into a dict or a sentence that tells the model what was wrong. Before a tool's own check,
every proposed call's arguments pass the same check as a client's ``tool.run``
(``protocol.rpc.arguments_problem``: JSON values only, OPS.md §1, at most 8 MiB). A call that
fails a check never gets a ``tool/call``: the turn loop settles it at once with
``INVALID_ARGUMENTS`` (or ``UNKNOWN_TOOL``; sentences from ``dshd.results``), and the model
reads the sentence in its next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import msgspec

from protocol.rpc import arguments_problem

from ..results import sentence

MAX_TIMEOUT_SECONDS = 7 * 86400


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict
    #: May run at the same time as other concurrent calls of the same step.
    concurrent: bool
    #: Returns None when the arguments are fine, else a sentence for the model.
    check: Callable[[dict], str | None]

    def schema(self) -> dict:
        """The chat-completions ``tools`` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def _check_bash(arguments: dict) -> str | None:
    command = arguments.get("command")
    if not isinstance(command, str) or not command.strip():
        return "bash needs `command`, a non-empty string"
    if "\0" in command:
        return "bash `command` must not contain a NUL character (a shell cannot run one)"
    timeout = arguments.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout <= MAX_TIMEOUT_SECONDS
    ):
        return f"`timeout` is seconds, a number > 0 and at most {MAX_TIMEOUT_SECONDS}"
    extra = sorted(set(arguments) - {"command", "timeout"})
    if extra:
        return f"bash takes `command` and `timeout` only, not {', '.join(extra)}"
    return None


BASH = ToolSpec(
    name="bash",
    description=(
        "Run a shell command with bash in the session's working directory, confined by the "
        "session's sandbox, after a person approves it. stdout and stderr come back merged; "
        "long output keeps its last 2,000 lines / 50 KB. Non-interactive: stdin is empty."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command line, run as `bash -c`."},
            "timeout": {
                "type": "number",
                "description": "Seconds before the command's process group is killed.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    concurrent=False,  # it may write: one at a time
    check=_check_bash,
)

TOOLS: dict[str, ToolSpec] = {BASH.name: BASH}

_decode = msgspec.json.Decoder()


def parse_arguments(name: str, raw: str) -> tuple[dict | None, str | None, str | None]:
    """``(arguments, errorCode, sentence)`` for a proposed call; arguments None when refused."""
    spec = TOOLS.get(name)
    if spec is None:
        known = ", ".join(sorted(TOOLS))
        return None, "UNKNOWN_TOOL", sentence("UNKNOWN_TOOL", name=name, known=known)
    invalid = "INVALID_ARGUMENTS"
    try:
        arguments = _decode.decode(raw.encode() if raw.strip() else b"{}")
    except (msgspec.DecodeError, UnicodeEncodeError) as exc:
        return None, invalid, sentence(invalid, "json", error=exc)
    if not isinstance(arguments, dict):
        return None, invalid, sentence(invalid, "object")
    problem = arguments_problem(arguments) or spec.check(arguments)
    if problem is not None:
        return None, invalid, sentence(invalid, problem=problem)
    return arguments, None, None


def schemas() -> list[dict]:
    return [spec.schema() for spec in TOOLS.values()]
