"""A tool is one entry of ``dshd.tools.TOOLS`` (issue 11): registering a second tool, and
nothing else, makes ``initialize`` list it, ``tool.run`` check and run it through the whole
pipeline (gate, barrier, confine, capture, settle), and the model see its schema.
Harness: ``conftest.py``."""

from __future__ import annotations

import msgspec

from dshd import tools
from dshd.agent.tools import schemas
from dshd.execution.spawn import BashScript


class EchoArguments(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    text: str


def _echo_spec() -> tools.ToolSpec:
    def invoke(arguments):
        script = BashScript(f"printf '%s' {_quote(arguments['text'])}")
        return tools.Invocation(script, None)

    return tools.ToolSpec(name="echo", description="Print a text.", arguments=EchoArguments,
                          concurrent=True, invoke=invoke,
                          sentences={"text": "echo needs arguments.text, a string"})


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


async def test_a_second_tool_is_one_registry_entry(daemon, daemon_clock, nursery, monkeypatch):
    monkeypatch.setitem(tools.TOOLS, "echo", _echo_spec())
    wire = await daemon.connect(initialize=False, nursery=nursery)
    hello = await wire.call("initialize", {"protocolVersion": 1})
    assert hello["tools"] == ["bash", "echo"]
    sid = await daemon.create_session(wire)

    started = await wire.call("tool.run", {"sessionId": sid, "name": "echo",
                                           "arguments": {"text": "it's here"}, "approved": True})
    result = await wire.wait(sid, started["callId"])
    assert result["content"] == "it's here" and result["exitCode"] == 0, result

    bad = await wire.error("tool.run", {"sessionId": sid, "name": "echo",
                                        "arguments": {"text": 7}, "approved": True})
    assert bad.code == -32602 and bad.message.endswith("echo needs arguments.text, a string")
    assert bad.data["field"] == "arguments.text"
    unknown = await wire.error("tool.run", {"sessionId": sid, "name": "nope",
                                            "arguments": {}, "approved": True})
    assert unknown.code == -32012 and "'echo'" in unknown.message

    names = [entry["function"]["name"] for entry in schemas()]
    assert names == ["bash", "echo"]
    echo = schemas()[1]["function"]["parameters"]
    assert echo["required"] == ["text"] and echo["properties"]["text"]["type"] == "string"
