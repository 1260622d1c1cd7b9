"""The tools a model may call, as the turn loop sees them: their schemas and the argument check.

Theory of operation: the tools are the daemon's tool registry (``dshd.tools``: ``TOOLS``,
each :class:`ToolSpec` with its JSON schema, its concurrency and its arguments struct); this
module adds what only a model needs. :func:`parse_arguments` takes the model's raw JSON
string, decodes it and passes it through ``dshd.tools.check_arguments``, the same check as a
client's ``tool.run`` (JSON values only, OPS.md §1, at most 8 MiB, then the tool's struct). A
call that fails it never gets a ``tool/call``: the turn loop settles it at once with
``INVALID_ARGUMENTS`` (or ``UNKNOWN_TOOL``; sentences from ``dshd.results``), and the model
reads the sentence in its next step. :func:`schemas` is the chat-completions ``tools`` list.
"""

from __future__ import annotations

import msgspec

from ..errors import InvalidParams, UnknownTool
from ..results import sentence
from ..tools import BASH, TOOLS, ToolSpec, check_arguments, tool_names

__all__ = ["BASH", "TOOLS", "ToolSpec", "parse_arguments", "schemas"]

_decode = msgspec.json.Decoder()


def parse_arguments(name: str, raw: str) -> tuple[dict | None, str | None, str | None]:
    """``(arguments, errorCode, sentence)`` for a proposed call; arguments None when refused."""
    invalid = "INVALID_ARGUMENTS"
    if name not in TOOLS:
        return None, "UNKNOWN_TOOL", sentence("UNKNOWN_TOOL", name=name,
                                              known=", ".join(tool_names()))
    try:
        arguments = _decode.decode(raw.encode() if raw.strip() else b"{}")
    except (msgspec.DecodeError, UnicodeEncodeError) as exc:
        return None, invalid, sentence(invalid, "json", error=exc)
    if not isinstance(arguments, dict):
        return None, invalid, sentence(invalid, "object")
    try:
        check_arguments(name, arguments)
    except UnknownTool:  # the registry changed under us: same answer as above
        return None, "UNKNOWN_TOOL", sentence("UNKNOWN_TOOL", name=name,
                                              known=", ".join(tool_names()))
    except InvalidParams as exc:
        return None, invalid, sentence(invalid, problem=exc.message)
    return arguments, None, None


def schemas() -> list[dict]:
    return [spec.schema() for spec in TOOLS.values()]
