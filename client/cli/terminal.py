"""What ``dsh`` writes to the terminal: stdout for a command's own output, stderr for the rest.

Theory of operation: a tool call's output is written to stdout's buffer as the command wrote
it (``emit_bytes``: never through rich, never escaped); tables and logs go through rich on a
terminal and as plain text otherwise (``is_tty``). Everything else -- progress, prompts,
errors -- is one line on stderr (``note``), and whatever came over the wire in it (commands,
titles, ids, the daemon's messages) is shown through ``protocol.printable.printable``, escape
sequences made visible. ``cell`` and ``short`` cut a value to a width for a table or a log
line. ``silence_stdout`` keeps the interpreter's final flush quiet after EPIPE. rich is
imported when something is first written through it, not when ``dsh`` starts (a ``dsh run``
that prints only its command's output never loads it).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from protocol.printable import printable

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["stderr", "stdout", "is_tty", "note", "emit", "emit_bytes", "print_json",
           "fmt_time", "short", "cell", "silence_stdout"]


def stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def stdout() -> Console:
    from rich.console import Console

    return Console(highlight=False, markup=False, soft_wrap=True)


def is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _text(text: str, style: str = "") -> Any:
    from rich.text import Text

    return Text(text, style=style)


def note(message: str, style: str | None = None) -> None:
    """One line on stderr; what came over the wire in it is shown escaped (``printable``)."""
    stderr().print(_text(printable(message, keep="\n\t"), style or ""))


def prompt(text: str, style: str = "bold") -> None:
    """A prompt on stderr, without a newline."""
    stderr().print(_text(text, style), end="")


def end_line(text: str = "") -> None:
    """End the current stderr line (after a prompt), with ``text`` shown escaped."""
    stderr().print(_text(printable(text)) if text else "")


def emit(text: str) -> None:
    """Write a piece of text to stdout, as is, at once."""
    if text:
        emit_bytes(text.encode("utf-8", "replace"))


def emit_bytes(data: bytes) -> None:
    """Write raw tool output to stdout, as is, at once."""
    if not data:
        return
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        out.flush()
        buffer.write(data)
        buffer.flush()
    else:
        out.write(data.decode("utf-8", "replace"))
        out.flush()


def print_json(value: Any) -> None:
    """``value`` -- plain JSON or protocol structs, which encode as on the wire (camelCase,
    absent fields left out) -- as one line of JSON."""
    emit(json.dumps(msgspec.to_builtins(value), ensure_ascii=False, sort_keys=False) + "\n")


def fmt_time(ms: Any, *, millis: bool = False) -> str:
    if not isinstance(ms, (int, float)):
        return "-"
    moment = _dt.datetime.fromtimestamp(ms / 1000)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{int(ms) % 1000:03d}" if millis else text


def short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           separators=(",", ":"))
    text = printable(text[: 2 * width + 8])
    return text if len(text) <= width else text[: width - 1] + "…"


def cell(value: Any, width: int | None = None) -> str:
    """A table cell on one line: characters that are not printable (tabs, newlines, ...)
    escaped, and at most ``width`` characters, cut with an ellipsis."""
    text = value if isinstance(value, str) else str(value)
    if width is not None:
        text = text[: 2 * width + 8]  # enough to fill the width: never escape 100 KB for 60
    text = printable(text)
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def silence_stdout() -> None:
    """After EPIPE, keep the interpreter's final flush of stdout from complaining."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
