"""The agent loop: turns, their steps, the model providers (issue 5; PROTOCOL.md §3.5).

``turn`` runs the loop (one ``TurnDriver`` per session, one running turn; ``state`` holds the
turn's state), ``resume`` takes up a turn that was waiting for tool calls when the daemon
stopped, ``history`` builds the conversation from the log (pure), ``tools`` says what a model
may call, ``model`` is the provider interface and its error tree, ``openai`` and ``scripted``
are the providers.
Everything a model proposes goes through the same tool pipeline as a frontend's call.
"""

from .model import ModelError, ModelRequest, ModelResponse, StreamHooks
from .providers import open_provider
from ..errors import NoTurn, SteerLimit, TurnBusy
from .turn import TurnDriver

__all__ = [
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "NoTurn",
    "SteerLimit",
    "StreamHooks",
    "TurnBusy",
    "TurnDriver",
    "open_provider",
]
