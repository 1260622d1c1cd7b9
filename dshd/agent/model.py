"""What the turn loop and a model provider exchange, and the provider errors (issue 5 §4).

Theory of operation: a provider has one method, :meth:`Provider.complete`: it takes a
:class:`ModelRequest` (chat messages in the chat-completions shape, tool schemas) and returns
one :class:`ModelResponse` (the assistant's text, its tool calls with their raw JSON
arguments, usage). While it streams it reports through :class:`StreamHooks`:

* ``before_send()`` is awaited right before each request goes out, never earlier: the turn
  loop's ``llm/stream`` checkpoint barrier. If it raises, nothing is sent.
* ``on_text(delta)`` for every piece of assistant text, in order (the lane grows with it);
* ``on_restart()`` when a retry throws away what an earlier attempt streamed.

A provider is opened for one turn (``async with dshd.agent.providers.open_provider(config)``),
so that its HTTP connection pool lives exactly as long as the turn that uses it.

Errors, one tree, mapped once at the provider boundary (nothing else leaves ``complete``
except cancellation and what a hook raised, e.g. the barrier's ``BarrierFailed``)::

    ModelError (code, sentence)
    ├── ModelUnavailable   MODEL_UNAVAILABLE  transport error, timeout, 429/5xx, cut stream —
    │                                         after the retries are spent
    ├── ModelRejected      MODEL_REJECTED     another 4xx (bad key, unknown model, bad request)
    └── ModelProtocolError MODEL_PROTOCOL     a response that is not the streaming subset
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol


class ModelError(Exception):
    """The model request failed; ``code`` is symbolic, ``sentence`` says what to do."""

    code = "MODEL_ERROR"

    def __init__(self, sentence: str) -> None:
        super().__init__(sentence)
        self.sentence = sentence


class ModelUnavailable(ModelError):
    code = "MODEL_UNAVAILABLE"


class ModelRejected(ModelError):
    code = "MODEL_REJECTED"


class ModelProtocolError(ModelError):
    code = "MODEL_PROTOCOL"


@dataclass(frozen=True)
class ModelRequest:
    """``messages``: chat-completions messages (system first); ``tools``: function schemas."""

    messages: list[dict]
    tools: list[dict]


@dataclass(frozen=True)
class ProposedCall:
    """One tool call as the model proposed it: ``arguments`` is the raw JSON text."""

    name: str
    arguments: str
    provider_id: str | None = None


@dataclass
class ModelResponse:
    text: str = ""
    calls: list[ProposedCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    model: str | None = None
    attempts: int = 1


@dataclass
class StreamHooks:
    before_send: Callable[[], Awaitable[None]]
    on_text: Callable[[str], None]
    on_restart: Callable[[], None]


class Provider(Protocol):
    name: str

    async def complete(self, request: ModelRequest, hooks: StreamHooks) -> ModelResponse: ...
