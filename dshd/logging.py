"""structlog set-up: configured at start (and again on a reload that changes the log format or
level); console on a TTY, JSON lines otherwise.

Theory of operation: request and session context is bound with contextvars
(``structlog.contextvars.bind_contextvars``) by the connection and session code, so each
log line carries it. The daemon writes one canonical line per request and one per settled
tool call; nothing else logs at info level on the hot path.

Loggers are cached on first use (a module-level logger is built once, not once per line:
building it was ~10 µs of every request). A reload still reaches them because a
reconfiguration changes the cached loggers' parts in place: the processor chain is one list
object whose items are replaced, and the wrapper class is one class whose level methods are
replaced by those of structlog's filtering logger for the new level (a line below the level
costs a no-op call, as with structlog's own filtering loggers). JSON lines are encoded with
msgspec (values it does not know are written as ``str(value)``) and written with
``WriteLogger`` (one ``write`` + ``flush`` per line).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog

#: The processor chain every cached logger holds; :func:`configure` replaces its items.
_PROCESSORS: list[Any] = []


class _LevelledLogger(structlog.BoundLoggerBase):
    """The wrapper class of every logger; :func:`configure` gives it the level methods of
    ``structlog.make_filtering_bound_logger(level)``."""


def _json_line(event: dict, **_kw: Any) -> str:
    return msgspec.json.encode(event, enc_hook=str).decode()


def _set_level(level: int) -> None:
    source = structlog.make_filtering_bound_logger(level)
    for name, fn in vars(source).items():
        if callable(fn) and not name.startswith("__"):
            setattr(_LevelledLogger, name, fn)


def configure(fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog for the process. ``fmt``: auto | console | json."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer = (structlog.dev.ConsoleRenderer() if use_console
                else structlog.processors.JSONRenderer(serializer=_json_line))
    _PROCESSORS[:] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        renderer,
    ]
    _set_level(getattr(logging, level.upper()))
    structlog.configure(
        processors=_PROCESSORS,
        wrapper_class=_LevelledLogger,
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str = "dshd"):
    return structlog.get_logger(name)
