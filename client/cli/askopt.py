"""``dsh run --ask-timeout``: how long a call that asks waits for an answer (PROTOCOL.md §3.4).

Theory of operation: the option's value is ``tool.run``'s ``askTimeout``: seconds the
daemon keeps a request nobody is attached to answer pending (listed by ``dsh approvals``,
answerable with ``dsh approve``) before it ends ``unavailable``. Finite, 0..3600 (0: at
once); checked here, before any session is made. Kept apart from ``client.cli.run`` so that
``dsh run`` loads nothing more for it (click only).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import click

__all__ = ["DEFAULT_ASK_TIMEOUT", "MAX_ASK_TIMEOUT", "ask_timeout_option"]

DEFAULT_ASK_TIMEOUT = 60.0
MAX_ASK_TIMEOUT = 3600.0


def _check(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or not 0 <= value <= MAX_ASK_TIMEOUT:
        raise click.BadParameter(f"seconds from 0 to {MAX_ASK_TIMEOUT:g}, not {value}")
    return value


def ask_timeout_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--ask-timeout", "ask_timeout", type=float, default=DEFAULT_ASK_TIMEOUT,
        show_default=True, metavar="S", callback=_check,
        help="With --ask: seconds the call waits for someone to answer (`dsh approvals`, "
             "`dsh approve`) before it ends unavailable; 0 = only an answerer attached now.",
    )(func)
