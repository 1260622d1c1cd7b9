"""Full-screen attach to a PTY call: a stand-in until the tuiterm room's ``client.tui.term``.

Theory of operation: :class:`AttachScreen` covers the app with one call: it shows the tail of
the lane's output window of that call (the app feeds it ``show(entry)`` with each lane view,
so it reuses the one subscription), sends each key the person types to the command with
``tool.write`` (through the app's live client; one worker drains a bounded queue, so keys
keep their order and the UI loop never waits), and returns to the main screen on the detach sequence Ctrl-P Ctrl-Q (like ``dsh
attach``) or when the call ends. It does not emulate a terminal (the tuiterm room's
``TerminalScreen`` does, with pyte); what it shows is the window the lane holds.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Static

from client.tui.calls import call_command, output_text

__all__ = ["AttachScreen", "KEY_BYTES", "OUTBOX_BOUND"]

#: Typed bytes not yet written to the call (keys typed faster than dshd takes them).
OUTBOX_BOUND = 1 << 20

#: Keys that are not one printable character, as the bytes a terminal sends for them.
KEY_BYTES = {"enter": b"\r", "tab": b"\t", "backspace": b"\x7f", "escape": b"\x1b",
             "up": b"\x1b[A", "down": b"\x1b[B", "right": b"\x1b[C", "left": b"\x1b[D",
             "home": b"\x1b[H", "end": b"\x1b[F", "delete": b"\x1b[3~"}


def key_bytes(event: events.Key) -> bytes | None:
    """What the terminal would send for ``event`` (None: nothing)."""
    if event.key in KEY_BYTES:
        return KEY_BYTES[event.key]
    if event.key.startswith("ctrl+") and len(event.key) == 6 and event.key[5].isalpha():
        return bytes([ord(event.key[5]) & 0x1F])
    if event.character and event.is_printable:
        return event.character.encode()
    return None


class AttachScreen(Screen[None]):
    """One PTY call full screen; Ctrl-P Ctrl-Q detaches."""

    HELP_NAME = "attach"
    BINDINGS: list = []
    EXTRA_KEYS = (("ctrl+p ctrl+q", "detach: back to the main screen (the call keeps running)"),
                  ("any other key", "typed into the call (tool.write)"))
    DEFAULT_CSS = """
    AttachScreen #term { height: 1fr; padding: 0 1; }
    AttachScreen #term-status { height: 1; background: $accent; }
    """

    def __init__(self, call_id: str, entry: dict[str, Any],
                 write: Callable[[bytes], Awaitable[None]]) -> None:
        super().__init__()
        self.call_id = call_id
        self.entry = entry
        self._write = write
        self._prefix = False
        self._outbox = bytearray()
        self._draining = False

    def compose(self) -> ComposeResult:
        yield Static(id="term")
        yield Static(f" attached to {self.call_id}: $ {call_command(self.entry)}  "
                     "· ctrl+p ctrl+q detaches", id="term-status")

    def on_mount(self) -> None:
        self.show(self.entry)

    def show(self, entry: dict[str, Any] | None) -> None:
        """The call's latest lane entry; None: it ended (the screen closes)."""
        if entry is None:
            self.dismiss(None)
            return
        self.entry = entry
        lines = max(1, self.size.height - 1)
        text = "\n".join(output_text(entry).rstrip("\n").split("\n")[-lines:])
        self.query_one("#term", Static).update(Text.from_ansi(text))

    def on_key(self, event: events.Key) -> None:
        event.stop()
        event.prevent_default()
        if self._prefix:
            self._prefix = False
            if event.key == "ctrl+q":
                self.dismiss(None)
                return
            self._send(b"\x10")
        if event.key == "ctrl+p":
            self._prefix = True
            return
        data = key_bytes(event)
        if data:
            self._send(data)

    def _send(self, data: bytes) -> None:
        """Queue ``data``; ONE worker writes the queue in order (keys never overtake)."""
        if len(self._outbox) + len(data) > OUTBOX_BOUND:
            self.notify("typing faster than the call takes input: key dropped",
                        severity="warning")
            return
        self._outbox += data
        if not self._draining:
            self._draining = True
            self.run_worker(self._drain(), group="attach-write")

    async def _drain(self) -> None:
        try:
            while self._outbox:
                chunk = bytes(self._outbox[:65536])
                del self._outbox[:len(chunk)]
                await self._write(chunk)
        finally:
            self._draining = False
