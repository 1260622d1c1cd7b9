"""The conversation built from the log (pure), the scripted provider's script, the [model] table."""

from __future__ import annotations

import pytest
import trio

from dshd.agent.history import build_messages, result_text
from dshd.agent.model import ModelError, ModelRequest, StreamHooks
from dshd.agent.scripted import DEMO_SCRIPT, Scripted, load_script
from dshd.agent.tools import parse_arguments
from dshd.config import ConfigError, load_config
from dshd.storage.format import Event
from dshd.storage.repair import repair_closers


def _log(*items: tuple[str, dict]) -> list[Event]:
    return [Event(seq=i, time=0, type=t, data=d) for i, (t, d) in enumerate(items)]


def _assistant(turn: str, text: str, *calls: str) -> tuple[str, dict]:
    data: dict = {"turnId": turn, "stepId": "s1", "text": text}
    if calls:
        data["toolCalls"] = [{"callId": c, "name": "bash", "arguments": '{"command": "ls"}'}
                             for c in calls]
    return ("message/assistant", data)


def test_every_call_is_followed_by_its_result_whatever_the_log_order():
    events = _log(
        ("turn/start", {"turnId": "t1"}),
        ("message/user", {"turnId": "t1", "text": "list"}),
        _assistant("t1", "", "c1", "c2"),
        ("tool/call", {"callId": "c1", "name": "bash", "arguments": "{}"}),
        ("tool/call", {"callId": "c2", "name": "bash", "arguments": "{}"}),
        ("message/user", {"turnId": "t1", "text": "steer", "steer": True}),
        ("tool/result", {"callId": "c2", "isError": False, "content": "two\n", "details": {},
                         "exitCode": 0}),
        ("tool/result", {"callId": "c1", "isError": True, "content": "one\n", "details": {},
                         "exitCode": 2}),
        _assistant("t1", "done"),
    )
    messages = build_messages(events, "SYS")
    assert [m["role"] for m in messages] == [
        "system", "user", "assistant", "tool", "tool", "user", "assistant"]
    assert messages[2]["content"] is None and [tc["id"] for tc in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "one\n[exit code: 2]"}
    assert messages[4]["content"] == "two\n[exit code: 0]"
    assert messages[5]["content"] == "steer" and messages[6]["content"] == "done"


def test_a_crashed_turn_reads_with_repairs_synthetic_results():
    events = _log(
        ("turn/start", {"turnId": "t1"}),
        ("message/user", {"turnId": "t1", "text": "go"}),
        ("step/start", {"turnId": "t1", "stepId": "s1"}),
        _assistant("t1", "running two", "ran", "never"),
        ("tool/call", {"callId": "ran", "name": "bash", "arguments": "{}"}),
    )
    closers = repair_closers(events)
    repaired = events + [Event(seq=len(events) + i, time=0, type=t, data=d)
                         for i, (t, d) in enumerate(closers)]
    messages = build_messages(repaired, "SYS")
    tools = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    assert "errorCode: TOOL_OUTCOME_UNKNOWN" in tools["ran"]
    assert "errorCode: TOOL_NOT_STARTED" in tools["never"]
    # Even an unrepaired log never yields a call without a result.
    unrepaired = {m["tool_call_id"]: m["content"] for m in build_messages(events, "S")
                  if m["role"] == "tool"}
    assert "TOOL_OUTCOME_UNKNOWN" in unrepaired["ran"] and "TOOL_NOT_STARTED" in unrepaired["never"]


def test_result_text_names_truncation_and_spill():
    text = result_text({"content": "tail\n", "exitCode": 0, "details": {
        "truncation": {"truncated": True, "truncatedBy": "lines", "maxLines": 2000,
                       "maxBytes": 51200, "totalLines": 5000, "totalBytes": 90000},
        "spillPath": "/s/spill/c.log"}}, called=True)
    assert text.startswith("tail\n[exit code: 0; output truncated by lines")
    assert "the full output is in /s/spill/c.log" in text
    assert result_text({"content": "", "details": {}}, called=True) == "(no output)"


@pytest.mark.parametrize("name, raw, code", [
    ("bash", '{"command": "ls"}', None),
    ("bash", '{"command": ""}', "INVALID_ARGUMENTS"),
    ("bash", '{"command": "ls", "timeout": -1}', "INVALID_ARGUMENTS"),
    ("bash", "[1]", "INVALID_ARGUMENTS"),
    ("bash", '{"command": "ls"', "INVALID_ARGUMENTS"),
    ("rm", "{}", "UNKNOWN_TOOL"),
])
def test_argument_checks(name, raw, code):
    arguments, got, sentence = parse_arguments(name, raw)
    assert got == code and (arguments is None) == (code is not None)
    if code:
        assert "nothing ran" in sentence or "no tool" in sentence


async def test_the_scripted_provider_replays_by_position(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "first", "toolCalls": [{"name": "bash", "arguments": {"command": "x"}}]}\n'
                    '\n{"text": "second"}\n')
    provider = Scripted.load(str(path))
    sent, texts = [], []

    async def before_send():
        sent.append(1)

    hooks = StreamHooks(before_send, texts.append, lambda: None)
    one = await provider.complete(ModelRequest([{"role": "user", "content": "u"}], []), hooks)
    two = await provider.complete(ModelRequest([{"role": "assistant", "content": "a"}], []), hooks)
    assert one.text == "first" and one.calls[0].arguments == '{"command":"x"}'
    assert two.text == "second" and two.calls == [] and len(sent) == 2
    assert load_script(None) is DEMO_SCRIPT
    path.write_text('{"text": 1}\n')
    with pytest.raises(ModelError) as exc:
        load_script(str(path))
    assert "line 1" in exc.value.sentence
    with pytest.raises(ModelError):
        load_script(str(tmp_path / "missing.jsonl"))
    await trio.lowlevel.checkpoint()


def test_model_table_in_the_config_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no dsh/dshd.toml there
    f = tmp_path / "dshd.toml"
    f.write_text('[model]\nprovider = "openai-compatible"\nbase_url = "http://127.0.0.1:9/v1"\n'
                 'model = "m"\napi_key_env = "K"\nmax_steps = 3\n')
    c = load_config(f)
    assert c.model.provider == "openai-compatible" and c.model.max_steps == 3
    assert c.model.api_key_env == "K" and c.model.script is None
    assert load_config(None, state_dir="/x").model.provider == "scripted"
    f.write_text('[model]\nprovder = "scripted"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(f)
    assert "provder" in str(exc.value)
    f.write_text('[model]\nmax_steps = 0\n')
    with pytest.raises(ConfigError):
        load_config(f)
