"""Support for the tuiterm tests (OutputView, TerminalScreen): a tiny Textual app around one
widget or screen, run with Textual's Pilot on asyncio against a real daemon.

How asyncio runs under this suite: pytest-trio's ``trio_mode`` takes every ``async def``
test, and Textual's ``run_test`` needs asyncio, so these tests are plain functions that call
``run_async(main)``: ``asyncio.run`` of the test's coroutine (the client library is anyio, so
``client.api.connect`` runs on asyncio as it does in ``dsh tui``). The daemon is a real
``dshd`` (``tests.e2e.conftest.daemon``, closed at the end with its hosts).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from textual.app import App, ComposeResult

LIVENESS_S = 60.0


def run_async(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())


async def until(check: Callable[[], Any], what: str, timeout: float = LIVENESS_S,
                pilot: Any = None) -> Any:
    """Poll ``check`` (sync) until it is truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        if pilot is not None:
            await pilot.pause(0.05)
        else:
            await asyncio.sleep(0.05)


class OneWidgetApp(App):
    """An app showing one widget, focused."""

    def __init__(self, widget: Any) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget

    def on_mount(self) -> None:
        self.widget.focus()


def screen_lines(widget: Any) -> list[str]:
    """The text of the rows the widget draws now (what a person sees)."""
    return [widget.render_line(y).text for y in range(widget.size.height)]


class ScreenHostApp(App):
    """An app with a plain home screen that pushes ``screen`` on mount and keeps what it was
    dismissed with in ``results``."""

    def __init__(self, screen: Any) -> None:
        super().__init__()
        self.pushed = screen
        self.results: list[Any] = []

    def compose(self) -> ComposeResult:
        from textual.widgets import Static

        yield Static("home screen", id="home")

    def on_mount(self) -> None:
        self.push_screen(self.pushed, self.results.append)


def terminal_text(view: Any) -> str:
    """What pyte's screen shows, one line per row, trailing blanks cut."""
    return "\n".join(line.rstrip() for line in view.screen_model.display)
