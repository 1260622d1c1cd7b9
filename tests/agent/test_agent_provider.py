"""The openai-compatible provider against the FAKE model server (real HTTP on 127.0.0.1):
deltas reassembled, usage recorded, retries on 429/5xx/cut streams, no retry on other 4xx,
and nothing sent when the llm/stream barrier fails."""

from __future__ import annotations

import json

import pytest

from dshd.agent.model import (
    ModelRejected,
    ModelRequest,
    ModelUnavailable,
    StreamHooks,
)
from dshd.agent.providers import open_provider
from dshd.agent.tools import schemas
from dshd.sessions.barrier import BarrierFailed
from tests.agent.fake_model_server import Reply, chunk, error_reply, text_reply, tool_reply
from tests.agent.helpers import fast_model


class Recorder:
    def __init__(self, fail_send: Exception | None = None) -> None:
        self.texts: list[str] = []
        self.restarts = 0
        self.sends = 0
        self.fail_send = fail_send

    async def before_send(self) -> None:
        self.sends += 1
        if self.fail_send is not None:
            raise self.fail_send

    def on_restart(self) -> None:
        self.restarts += 1

    def hooks(self) -> StreamHooks:
        return StreamHooks(self.before_send, self.texts.append, self.on_restart)


async def complete(fake, rec: Recorder, **overrides):
    request = ModelRequest([{"role": "system", "content": "sys"},
                            {"role": "user", "content": "hi"}], schemas())
    async with open_provider(fast_model(fake.url, **overrides)) as provider:
        return await provider.complete(request, rec.hooks())


async def test_split_deltas_are_reassembled_and_usage_recorded(fake_model, monkeypatch):
    monkeypatch.setenv("DSH_TEST_MODEL_KEY", "sk-fake-123")
    args0 = {"command": "echo 'a \"quoted\" word' && ls -la", "timeout": 5}
    fake_model.script(tool_reply([("bash", args0), ("bash", '{"command": "pwd"}')],
                                 text="Let me look.", split=5))
    rec = Recorder()
    response = await complete(fake_model, rec)
    # Two calls, each with its arguments split across 5 chunks, reassembled byte for byte.
    assert [c.name for c in response.calls] == ["bash", "bash"]
    assert json.loads(response.calls[0].arguments) == args0
    assert response.calls[1].arguments == '{"command": "pwd"}'
    assert [c.provider_id for c in response.calls] == ["call_fake_0", "call_fake_1"]
    assert response.text == "Let me look." and "".join(rec.texts) == "Let me look."
    assert len(rec.texts) == 3  # streamed piece by piece
    assert response.finish_reason == "tool_calls" and response.model == "fake-model-1"
    assert response.usage == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    (req,) = fake_model.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer sk-fake-123"
    body = req["body"]
    assert body["stream"] is True and body["model"] == "fake-model-1"
    assert body["stream_options"] == {"include_usage": True}
    assert body["tools"][0]["function"]["name"] == "bash"
    assert body["messages"][-1] == {"role": "user", "content": "hi"}


async def test_429_then_success_is_retried(fake_model):
    fake_model.script(error_reply(429, "slow down", headers={"Retry-After": "0"}),
                      text_reply("fine now"))
    rec = Recorder()
    response = await complete(fake_model, rec)
    assert response.text == "fine now" and response.attempts == 2
    assert len(fake_model.requests) == 2 and rec.sends == 2 and rec.restarts == 1


async def test_persistent_500_gives_up_after_the_retries(fake_model):
    fake_model.script(*[error_reply(500, "boom")] * 3)
    rec = Recorder()
    with pytest.raises(ModelUnavailable) as exc:
        await complete(fake_model, rec, max_retries=2)
    assert len(fake_model.requests) == 3  # 1 + max_retries
    assert "500" in exc.value.sentence and "boom" in exc.value.sentence
    assert exc.value.code == "MODEL_UNAVAILABLE"


async def test_a_stream_cut_midway_is_retried_from_scratch(fake_model):
    cut = text_reply("this will be cut off", pieces=5)
    cut.cut_after = 3
    fake_model.script(cut, text_reply("whole answer"))
    rec = Recorder()
    response = await complete(fake_model, rec)
    assert response.text == "whole answer" and response.attempts == 2
    assert rec.restarts == 1  # what the cut attempt streamed was thrown away
    assert "".join(rec.texts).endswith("whole answer")


async def test_a_stream_without_done_or_finish_is_a_cut(fake_model):
    fake_model.script(*[Reply(events=[chunk({"content": "half"})], done=False)] * 2)
    with pytest.raises(ModelUnavailable) as exc:
        await complete(fake_model, Recorder(), max_retries=1)
    assert "broke off" in exc.value.sentence and len(fake_model.requests) == 2


async def test_other_4xx_is_not_retried(fake_model):
    fake_model.script(error_reply(401, "bad key"))
    with pytest.raises(ModelRejected) as exc:
        await complete(fake_model, Recorder())
    assert len(fake_model.requests) == 1
    assert "DSH_TEST_MODEL_KEY" in exc.value.sentence


async def test_a_failed_barrier_sends_nothing(fake_model):
    fake_model.script(text_reply("never"))
    failure = BarrierFailed("STORAGE_FAILURE", "disk says no")
    with pytest.raises(BarrierFailed):
        await complete(fake_model, Recorder(fail_send=failure))
    assert fake_model.requests == []
