"""The ``openai-compatible`` provider: streaming chat completions over HTTP (issue 5 §4).

Theory of operation: one request per step, ``POST {base_url}/chat/completions`` with
``stream: true``, the tools and ``stream_options.include_usage``, through an ``httpx``
``AsyncClient`` that lives as long as the turn (httpx runs on trio through anyio). The body
is Server-Sent Events, parsed by ``httpx-sse``: ``data: {chunk}`` lines, then
``data: [DONE]``. Each chunk is decoded with one msgspec decoder of the streaming subset:

* ``choices[0].delta.content`` → ``hooks.on_text`` (the lane grows with it);
* ``choices[0].delta.tool_calls[]`` → reassembled per ``index``: ``id`` and ``function.name``
  come in the first delta of a call, ``function.arguments`` arrives in pieces and is
  concatenated (kept raw: the turn loop checks it);
* ``finish_reason``, ``usage`` (the last chunk with ``include_usage``), ``model`` are recorded.

Retries (``stamina``, exponential backoff with jitter, trio-aware): an answer 429 or 5xx, a
transport error (connect, timeout, connection reset), a stream that ends before ``[DONE]``
and before any ``finish_reason`` (a cut stream), and an ``error`` chunk are retried up to
``max_retries`` times; a 429's ``Retry-After`` (seconds) replaces the backoff, up to
``retry_max_seconds``. A retry calls ``hooks.on_restart()`` first (what the cut attempt
streamed is thrown away) and ``hooks.before_send()`` again (a no-op once the log is durable).
Any other 4xx is not retried. ``request_timeout_seconds`` bounds the connect and every wait
for the next bytes of the stream.

Exceptions are mapped once, at the end of :meth:`complete`, to the ``ModelError`` tree of
``dshd.agent.model``; the sentence names the endpoint and what to do.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator

import httpx
import msgspec
import stamina
import structlog
from httpx_sse import EventSource, SSEError

from .model import (
    ModelProtocolError,
    ModelRejected,
    ModelRequest,
    ModelResponse,
    ModelUnavailable,
    ProposedCall,
    StreamHooks,
)

if TYPE_CHECKING:
    from ..config import ModelConfig

log = structlog.get_logger("dshd.agent.openai")

#: Bytes of an error body quoted in a sentence.
ERROR_BODY_QUOTE = 300


# ---------------------------------------------------------------------- the streaming subset
class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: dict | None = None
    model: str | None = None
    error: dict | str | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_encode = msgspec.json.Encoder()


# ---------------------------------------------------------------------- internal failures
class _HttpStatus(Exception):
    def __init__(self, status: int, body: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body
        self.retry_after = retry_after


class _StreamCut(Exception):
    """The stream ended (or reported an error) before the response was complete."""


class _Protocol(Exception):
    """Something that is not the streaming chat-completions subset."""


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: use the backoff instead
    return max(seconds, 0.0)


@dataclass
class _Slot:
    provider_id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _Assembler:
    """Tool calls reassembled from their deltas, keyed by ``index``."""

    def __init__(self) -> None:
        self.slots: dict[int, _Slot] = {}
        self._last: int | None = None

    def feed(self, deltas: list[_ToolCallDelta]) -> None:
        for d in deltas:
            index = d.index
            if index is None:  # servers that omit it: a new id opens a new call
                last = self.slots.get(self._last) if self._last is not None else None
                if last is None or (d.id and last.provider_id and d.id != last.provider_id):
                    index = len(self.slots)
                else:
                    index = self._last
            slot = self.slots.setdefault(index, _Slot())
            self._last = index
            if d.id:
                slot.provider_id = d.id
            if d.function is not None:
                name = d.function.name
                if name and name != slot.name:
                    slot.name = name if not slot.name else slot.name + name
                if d.function.arguments:
                    slot.arguments.append(d.function.arguments)

    def calls(self) -> list[ProposedCall]:
        return [
            ProposedCall(s.name, "".join(s.arguments), s.provider_id)
            for _, s in sorted(self.slots.items())
        ]


# ---------------------------------------------------------------------- the provider
class OpenAICompatible:
    name = "openai-compatible"

    def __init__(self, config: "ModelConfig", client: httpx.AsyncClient) -> None:
        self.config = config
        self.client = client
        self.url = config.base_url.rstrip("/") + "/chat/completions"

    @classmethod
    @asynccontextmanager
    async def open(cls, config: "ModelConfig") -> AsyncIterator["OpenAICompatible"]:
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        key = os.environ.get(config.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        timeout = httpx.Timeout(config.request_timeout_seconds)
        async with httpx.AsyncClient(headers=headers, timeout=timeout) as client:
            yield cls(config, client)

    def _body(self, request: ModelRequest) -> bytes:
        body: dict = {
            "model": self.config.model,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = request.tools
        return _encode.encode(body)

    def _retry_on(self, exc: Exception) -> bool | float:
        if isinstance(exc, _HttpStatus):
            if exc.status == 429 or exc.status >= 500:
                if exc.retry_after is not None:
                    return min(exc.retry_after, self.config.retry_max_seconds)
                return True
            return False
        return isinstance(exc, (httpx.TransportError, _StreamCut))

    async def complete(self, request: ModelRequest, hooks: StreamHooks) -> ModelResponse:
        cfg = self.config
        body = self._body(request)
        attempts = 0
        try:
            async for attempt in stamina.retry_context(
                on=self._retry_on,
                attempts=cfg.max_retries + 1,
                timeout=None,
                wait_initial=cfg.retry_initial_seconds,
                wait_max=cfg.retry_max_seconds,
                wait_jitter=cfg.retry_initial_seconds,
            ):
                with attempt:
                    attempts = attempt.num
                    if attempts > 1:
                        hooks.on_restart()
                    response = await self._attempt(body, hooks)
                    response.attempts = attempts
                    return response
        except _HttpStatus as exc:
            quoted = exc.body.strip()[:ERROR_BODY_QUOTE]
            where = f"the model endpoint {self.url} answered {exc.status}"
            if exc.status == 429 or exc.status >= 500:
                raise ModelUnavailable(
                    f"{where} ({quoted}) on all {attempts} attempts; try again later"
                ) from None
            if exc.status in (401, 403):
                raise ModelRejected(
                    f"{where} ({quoted}): check the API key in ${cfg.api_key_env} "
                    "(dshd's environment)"
                ) from None
            raise ModelRejected(
                f"{where} ({quoted}); check [model].model and [model].base_url"
            ) from None
        except httpx.TimeoutException as exc:
            raise ModelUnavailable(
                f"the model endpoint {self.url} did not answer within "
                f"{cfg.request_timeout_seconds} s ({type(exc).__name__}) on all {attempts} "
                "attempts; try again later or raise [model].request_timeout_seconds"
            ) from None
        except httpx.TransportError as exc:
            raise ModelUnavailable(
                f"cannot reach the model endpoint {self.url} ({type(exc).__name__}: {exc}) "
                f"after {attempts} attempts; check [model].base_url and the network"
            ) from None
        except _StreamCut as exc:
            raise ModelUnavailable(
                f"the response stream of {self.url} broke off ({exc}) on all {attempts} "
                "attempts; try again later"
            ) from None
        except (_Protocol, SSEError, msgspec.DecodeError) as exc:
            raise ModelProtocolError(
                f"the model endpoint {self.url} does not speak streaming chat completions "
                f"({exc}); check [model].base_url"
            ) from None
        raise AssertionError("unreachable: stamina either returns or raises")

    async def _attempt(self, body: bytes, hooks: StreamHooks) -> ModelResponse:
        await hooks.before_send()  # the llm/stream barrier: nothing is sent before it holds
        async with self.client.stream("POST", self.url, content=body) as response:
            if response.status_code != 200:
                raw = await response.aread()
                raise _HttpStatus(
                    response.status_code,
                    raw.decode("utf-8", "replace"),
                    _retry_after(response.headers.get("retry-after")),
                )
            out = ModelResponse()
            text: list[str] = []
            calls = _Assembler()
            done = False
            async for sse in EventSource(response).aiter_sse():
                data = sse.data
                if data.strip() == "[DONE]":
                    done = True
                    break
                if not data.strip():
                    continue
                chunk = _decode_chunk(data)
                if chunk.error is not None:
                    raise _StreamCut(f"the stream reported an error: {chunk.error}")
                if chunk.model:
                    out.model = chunk.model
                if chunk.usage is not None:
                    out.usage = chunk.usage
                for choice in chunk.choices:
                    if choice.index != 0:
                        continue
                    delta = choice.delta
                    if delta is not None:
                        if delta.content:
                            text.append(delta.content)
                            hooks.on_text(delta.content)
                        if delta.tool_calls:
                            calls.feed(delta.tool_calls)
                    if choice.finish_reason:
                        out.finish_reason = choice.finish_reason
            if not done and out.finish_reason is None:
                raise _StreamCut("it ended before [DONE]")
        out.text = "".join(text)
        out.calls = calls.calls()
        for call in out.calls:
            if not call.name:
                raise _Protocol("a tool call without a function name")
        return out
