"""structlog set-up: configured at start (and again on a reload that changes the log format or
level); console on a TTY, JSON lines otherwise.

Theory of operation: request and session context is bound with contextvars
(``structlog.contextvars.bind_contextvars``) by the connection and session code, so each
log line carries it. The daemon writes one canonical line per request and one per settled
tool call; nothing else logs at info level on the hot path. Loggers are not cached on first
use, so a reconfiguration reaches the module-level loggers too.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog for the process. ``fmt``: auto | console | json."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer = structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,  # a reload reconfigures
    )


def get_logger(name: str = "dshd"):
    return structlog.get_logger(name)
