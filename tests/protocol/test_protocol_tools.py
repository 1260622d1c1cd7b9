"""The tool registry (dshd.tools): one argument rule for a client's tool.run and a model's call,
and the model's schema derived from the arguments struct (PROTOCOL.md §3.2, EXEC.md §1)."""

from __future__ import annotations

import msgspec
import pytest

from dshd import errors, tools
from dshd.agent.tools import parse_arguments, schemas
from protocol.methods import BashArguments

# (arguments, field the refusal names or None when accepted): PROTOCOL.md §3.2's rule.
CASES = [
    ({"command": "ls"}, None),
    ({"command": " "}, None),  # non-empty: a blank command is a command
    ({"command": "ls", "extra": 1}, None),  # other keys are ignored
    ({"command": "ls", "timeout": 604800}, None),
    ({}, "arguments.command"),
    ({"command": ""}, "arguments.command"),
    ({"command": 7}, "arguments.command"),
    ({"command": "a\0b"}, "arguments.command"),
    ({"command": "ls", "timeout": 0}, "arguments.timeout"),
    ({"command": "ls", "timeout": 604801}, "arguments.timeout"),
    ({"command": "ls", "timeout": True}, "arguments.timeout"),
    ({"command": "ls", "timeout": "5"}, "arguments.timeout"),
]


@pytest.mark.parametrize("arguments, field", CASES)
def test_a_client_and_a_model_get_the_same_verdict(arguments, field):
    """Before the registry a blank command was valid from a client and INVALID_ARGUMENTS
    from a model, and extra keys were refused from a model only."""
    try:
        tools.check_arguments("bash", arguments)
        client_refusal = None
    except errors.InvalidParams as exc:
        client_refusal = exc
    accepted, code, sentence = parse_arguments("bash", msgspec.json.encode(arguments).decode())
    if field is None:
        assert client_refusal is None and code is None and accepted == arguments
    else:
        assert client_refusal is not None and client_refusal.data == {"field": field}
        assert code == "INVALID_ARGUMENTS" and accepted is None
        assert sentence.startswith(client_refusal.message)  # the same sentence, "; nothing ran"


def test_the_client_sentences_are_the_ones_the_wire_had():
    def refusal(arguments):
        with pytest.raises(errors.InvalidParams) as info:
            tools.check_arguments("bash", arguments, values_checked=True)
        return info.value.message

    assert refusal({"command": ""}) == "bash needs arguments.command, a non-empty string"
    assert refusal({"command": "x\0"}) == ("arguments.command must not contain a NUL "
                                           "character (a shell cannot run one)")
    assert refusal({"command": "x", "timeout": -1}) == (
        "arguments.timeout is seconds, a number > 0 (at most 7 days)")


def test_an_unknown_tool_and_non_json_values():
    with pytest.raises(errors.UnknownTool, match=r"unknown tool 'rm'; known: \['bash'\]"):
        tools.check_arguments("rm", {})
    with pytest.raises(errors.InvalidParams) as info:
        tools.check_arguments("bash", {"command": "ls", "n": 2**60})
    assert info.value.data == {"field": "arguments"} and "OPS.md §1" in info.value.message
    assert parse_arguments("rm", "{}")[1] == "UNKNOWN_TOOL"


def test_the_model_sees_the_schema_of_the_struct_that_checks():
    (entry,) = schemas()
    assert entry["function"]["name"] == "bash"
    parameters = entry["function"]["parameters"]
    expected = msgspec.json.schema(BashArguments)["$defs"]["BashArguments"]
    assert parameters["properties"] == expected["properties"]
    assert parameters["required"] == ["command"]
    assert parameters["properties"]["command"]["minLength"] == 1
    assert parameters["properties"]["timeout"]["anyOf"][0]["maximum"] == 604800
    assert "title" not in parameters and "description" not in parameters


def test_every_tool_of_the_registry_has_a_struct_and_a_schema():
    for name, spec in tools.TOOLS.items():
        assert spec.name == name and issubclass(spec.arguments, msgspec.Struct)
        assert spec.schema()["function"]["parameters"]["type"] == "object"
        assert set(spec.sentences) <= set(spec.arguments.__struct_fields__)
