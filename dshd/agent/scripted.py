"""The ``scripted`` provider: canned assistant responses from a JSONL file (offline demos, tests).

Theory of operation: a script is a list of responses, one JSON object a line::

    {"text": "Let me look.", "toolCalls": [{"name": "bash", "arguments": {"command": "ls"}}]}
    {"text": "Done: the directory holds three files.", "paceMs": 15}

``text`` streams word by word (``paceMs`` between words, default 0), ``toolCalls`` are proposed
as they are (``arguments`` an object or a raw JSON string, passed through unchecked so a script
can also propose a broken call). The response for a request is chosen by how many assistant
messages the request already carries, modulo the script's length: the position lives in the
session log, so it survives a daemon restart, and a new turn of the same session goes on
where the last one stopped. With no ``script`` configured, :data:`DEMO_SCRIPT` is used.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import trio

from .history import assistant_count
from .model import ModelError, ModelRequest, ModelResponse, ProposedCall, StreamHooks

_encode = msgspec.json.Encoder()


class ScriptedCall(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: dict | str = msgspec.field(default_factory=dict)


class ScriptedResponse(msgspec.Struct, forbid_unknown_fields=True):
    text: str = ""
    toolCalls: list[ScriptedCall] = msgspec.field(default_factory=list)
    paceMs: int = 0


#: The embedded default: look at the workspace (one approved, sandboxed bash call), then answer.
DEMO_SCRIPT: list[ScriptedResponse] = [
    ScriptedResponse(
        text="Hello! I am dshd's built-in scripted model, so my answers are canned, but my "
        "tool calls are real. Let me look at the workspace first.",
        toolCalls=[ScriptedCall("bash", {"command": "pwd && ls -la | head -n 20"})],
        paceMs=15,
    ),
    ScriptedResponse(
        text="Above is the workspace listing. That command went through dshd's whole "
        "pipeline: logged durably, approved by you, run in the sandbox, output captured. "
        "Set the [model] table of dshd.toml to an openai-compatible endpoint for real answers.",
        paceMs=15,
    ),
]

_WORDS = re.compile(r"\s*\S+|\s+")


def load_script(path: str | None) -> list[ScriptedResponse]:
    """The script at ``path`` (None: the demo). Raises ModelError naming the file and line."""
    if path is None:
        return DEMO_SCRIPT
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ModelError(
            f"the scripted provider cannot read its script {file}: {exc.strerror or exc}; "
            "fix [model].script in the dshd config"
        ) from None
    script = []
    decoder = msgspec.json.Decoder(ScriptedResponse)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            script.append(decoder.decode(line))
        except msgspec.DecodeError as exc:
            raise ModelError(f"script {file} line {number}: {exc}") from None
    if not script:
        raise ModelError(f"script {file} holds no responses")
    return script


class Scripted:
    name = "scripted"

    def __init__(self, script: list[ScriptedResponse]) -> None:
        self.script = script

    @classmethod
    def load(cls, path: str | None) -> "Scripted":
        return cls(load_script(path))

    async def complete(self, request: ModelRequest, hooks: StreamHooks) -> ModelResponse:
        await hooks.before_send()
        entry = self.script[assistant_count(request.messages) % len(self.script)]
        for piece in _WORDS.findall(entry.text):
            hooks.on_text(piece)
            if entry.paceMs:
                await trio.sleep(entry.paceMs / 1000)
            else:
                await trio.lowlevel.checkpoint()
        calls = [
            ProposedCall(
                c.name,
                c.arguments if isinstance(c.arguments, str) else _encode.encode(c.arguments).decode(),
            )
            for c in entry.toolCalls
        ]
        return ModelResponse(
            text=entry.text,
            calls=calls,
            finish_reason="tool_calls" if calls else "stop",
            model="scripted",
        )
