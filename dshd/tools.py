"""The tool registry: every tool dshd runs, its arguments struct, and the one argument check.

Theory of operation: :data:`TOOLS` maps a tool's name to its :class:`ToolSpec`: the msgspec
struct its ``arguments`` decode into (``protocol.methods.BashArguments``: the rule of
PROTOCOL.md §3.2 written once, as struct constraints), the description and JSON schema a
model is shown (the schema is ``msgspec.json.schema`` of that struct, so what the model is
told and what is checked cannot drift apart), whether calls of it may run side by side with
their neighbours in one step (``concurrent``), and the sentence for each field that has the
wrong shape. :func:`check_arguments` is the ONE check of a tool call's arguments, used by a
client's ``tool.run`` (``dshd.handlers``) and by a model's proposed call (``dshd.agent``): an
unknown tool is :class:`dshd.errors.UnknownTool`, arguments that are not JSON values or over
the cap (``protocol.methods.arguments_problem``) or that break the tool's struct are
:class:`dshd.errors.InvalidParams` naming the field (``arguments.timeout``). The client gets
the error as ``-32602`` / ``-32012``; the turn loop settles the model's call with the same
sentence (``INVALID_ARGUMENTS`` / ``UNKNOWN_TOOL``).

A spec also carries the tool's implementation, ``invoke``: checked arguments in, an
:class:`Invocation` out (the script the command's owner runs, closed by it, and the call's
timeout). The call pipeline (``dshd.sessions.command``) looks the tool up here and confines and
runs whatever script it gets, so it names no tool.

Adding a tool: its arguments struct (in ``protocol.methods`` when clients build it), one
:data:`TOOLS` entry here with its ``invoke``, and what that needs (``dshd/execution/``);
``initialize`` lists it and the model sees it from this table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from protocol.methods import BashArguments, arguments_problem

from .errors import InvalidParams, UnknownTool
from .execution.spawn import BashScript

__all__ = ["BASH", "TOOLS", "Invocation", "ToolSpec", "check_arguments", "tool_names"]


@dataclass(frozen=True)
class Terminal:
    """The PTY a ``tty`` call runs under: its size (HOST.md §5)."""

    cols: int
    rows: int


@dataclass(frozen=True)
class Invocation:
    """What the command's owner runs for one call: ``script`` (its ``argv``; the owner closes
    it), ``timeout`` in seconds (None: no timeout), ``tty`` (None: pipes) and ``stdin``
    (``"null"`` or ``"pipe"``; a tty call's stdin is its terminal)."""

    script: BashScript
    timeout: float | None
    tty: Terminal | None = None
    stdin: str = "null"


@dataclass(frozen=True)
class ToolSpec:
    """One tool. ``arguments``: its msgspec struct; ``sentences``: field -> what to say when
    the field has the wrong type or range (msgspec's own message otherwise)."""

    name: str
    description: str
    arguments: type
    #: May run at the same time as other concurrent calls of the same step.
    concurrent: bool
    #: The implementation: checked arguments (their JSON object) -> what to run.
    invoke: Callable[[Mapping[str, Any]], Invocation]
    sentences: Mapping[str, str] = field(default_factory=dict)

    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments, inline (``msgspec.json.schema`` of the struct)."""
        schema = msgspec.json.schema(self.arguments)
        ref = schema.get("$ref", "")
        body = dict(schema.get("$defs", {}).get(ref.rsplit("/", 1)[-1], schema))
        body.pop("title", None)  # the struct's name and docstring are not for the model
        body.pop("description", None)
        return body

    def schema(self) -> dict[str, Any]:
        """The chat-completions ``tools`` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters(),
            },
        }


def _invoke_bash(arguments: Mapping[str, Any]) -> Invocation:
    timeout = arguments.get("timeout")
    tty = (Terminal(int(arguments.get("cols", 80)), int(arguments.get("rows", 24)))
           if arguments.get("tty") else None)
    return Invocation(BashScript(arguments["command"]),
                      float(timeout) if timeout is not None else None,
                      tty=tty, stdin="pipe" if tty is not None else arguments.get("stdin", "null"))


BASH = ToolSpec(
    name="bash",
    description=(
        "Run a shell command with bash in the session's working directory, confined by the "
        "session's sandbox, after a person approves it. stdout and stderr come back merged; "
        "long output keeps only its tail (the daemon's output window; the result says what was "
        "cut). env sets variables for this command only. stdin is empty unless stdin is \"pipe\" (written with tool.write); tty: true "
        "runs it under a terminal of cols x rows (default 80x24) for programs that need one."
    ),
    arguments=BashArguments,
    concurrent=False,  # it may write: one at a time
    invoke=_invoke_bash,
    sentences={
        "command": "bash needs arguments.command, a non-empty string",
        "timeout": "arguments.timeout is seconds, a number > 0 (at most 7 days)",
        "tty": "arguments.tty is true (run under a terminal) or false (pipes, the default)",
        "cols": "arguments.cols is the terminal's width, a whole number from 1 to 10000",
        "rows": "arguments.rows is the terminal's height, a whole number from 1 to 10000",
        "stdin": 'arguments.stdin is "null" (empty, the default) or "pipe" (written with '
                 "tool.write)",
        "env": "arguments.env is an object of at most 256 names (shell names, <= 256 chars) "
               "to string values (<= 32768 chars)",
    },
)

#: Tool name -> spec: the tools ``initialize`` lists, ``tool.run`` runs and the model sees.
TOOLS: dict[str, ToolSpec] = {BASH.name: BASH}

#: msgspec's own sentences start so; anything else came from a struct's ``__post_init__``
#: and is already the sentence to show.
_MSGSPEC_WORDING = ("Expected ", "Object missing required field", "Invalid enum value")


def tool_names() -> list[str]:
    return sorted(TOOLS)


def check_arguments(name: str, arguments: Any, *, values_checked: bool = False) -> Any:
    """The arguments struct of a call of tool ``name`` (module doc), or raise.

    ``values_checked``: ``arguments_problem`` already passed (``tool.run``'s params struct
    runs it while decoding), so it is not run twice on up to 8 MiB.
    """
    spec = TOOLS.get(name)
    if spec is None:
        raise UnknownTool(f"unknown tool {name!r}; known: {tool_names()}")
    if not values_checked:
        problem = arguments_problem(arguments)
        if problem is not None:
            raise InvalidParams(problem, field="arguments")
    try:
        return msgspec.convert(arguments, spec.arguments)
    except msgspec.ValidationError as exc:
        raise _invalid(spec, str(exc)) from None


def _invalid(spec: ToolSpec, detail: str) -> InvalidParams:
    text, _, where = detail.partition(" - at `$.")
    if where:
        path = where.rstrip("`")
    elif detail.startswith("Object missing required field `"):
        path = detail.split("`")[1]
    else:
        path = ""
    top = path.split(".")[0].split("[")[0]
    if text.startswith(_MSGSPEC_WORDING):
        text = spec.sentences.get(top, f"{spec.name} arguments: {detail}")
    return InvalidParams(text, field=f"arguments.{path}" if path else "arguments")
