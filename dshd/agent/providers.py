"""Opening the configured model provider for one turn.

Theory of operation: the ``[model]`` table names a provider; :func:`open_provider` opens it
for the duration of one turn (the openai-compatible provider's HTTP connection pool lives
exactly as long as the turn that uses it; the scripted one loads its script). It sits apart
from ``model`` (the interface both providers implement), so that the providers depend on the
interface and nothing depends back. The openai-compatible provider (httpx, stamina: about
half a second of imports) is imported by the first turn that uses it, not by every daemon
start.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

from ..config import ModelConfig
from .model import Provider
from .scripted import Scripted


@asynccontextmanager
async def open_provider(config: ModelConfig) -> AsyncIterator[Provider]:
    """The configured provider, open for one turn. Raises ModelError when it cannot start
    (a missing or malformed script, for instance)."""
    if config.provider == "openai-compatible":
        from .openai import OpenAICompatible  # module doc: on first use

        async with OpenAICompatible.open(config) as provider:
            yield provider
    else:
        yield Scripted.load(config.script)
