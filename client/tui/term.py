"""``TerminalScreen``: full-screen attach to a call that runs under a PTY (``tty: true``).

Theory of operation: ``TerminalView`` is a terminal emulator inside the TUI. It follows the
call's raw output (``tool.follow``, from ``REPLAY_BYTES`` before the end of what is retained:
the resize below makes a full-screen program draw itself again) and feeds the bytes to a
``pyte.Screen`` of the widget's size; ``render_line`` draws pyte's rows with their colours
and attributes, and the cursor in reverse. Output is fed and redrawn at most
``REDRAWS_PER_S`` times a second; bytes waiting to be fed are bounded (``PENDING_BOUND``: a
flood faster than the emulator keeps its newest bytes). What pyte answers to the program's
queries (device attributes, cursor position) goes back as input. The emulator never takes
the app down on a byte sequence: ``_Screen`` ignores private SGR (``ESC[>4;2m``, ``ESC[?4m``:
xterm's modifyOtherKeys, which vim writes and pyte 0.8 refuses with a ``TypeError``), and
``_TolerantStream`` logs any other exception of pyte's parser or screen, counts it
(``emulator_errors``) and skips the bad sequence (pyte resets its parser): the bytes after it
are still drawn.

Every key goes to the command: ``keys_to_bytes`` turns a Textual key event into the bytes a
terminal (xterm) sends -- printable characters as UTF-8, Enter ``\\r``, Backspace ``\\x7f``,
Tab, Esc, arrows ``\\x1b[A``..., Home/End, Page Up/Down, Insert/Delete, F1-F12, Ctrl-letters
-- and a writer sends them in order with ``tool.write`` (waiting input bounded by
``INPUT_BOUND``). The widget consumes every key (``check_consume_key``), so no binding of the
screen or the app (not even a priority one such as Ctrl-Q quit or Ctrl-P's palette) takes a
key from the command. The detach sequence is ``dsh attach``'s (``client.cli.keys``: Ctrl-P
Ctrl-Q by default, docker's rule: a held prefix followed by another key goes on as typed);
it dismisses the screen with ``"detached"`` and leaves the call running. The widget's size
goes to the PTY with ``tool.resize`` when it is mounted and on every resize, and pyte's
screen takes the same size. When the call ends the screen says so and the next key
dismisses it with ``"ended"``. ``resume(client)`` follows again on a new connection from
the next offset not received. A one-line footer under the terminal says how to detach (the
PTY gets the rows above it), and once the call ended how to return instead (any key); the
"command ended" popup lasts 3 s and goes with the key that returns.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pyte
from rich.color import Color
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.message import Message
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from client.cli.keys import DEFAULT_DETACH_KEYS, DetachScanner, describe_keys, parse_detach_keys
from client.raw import Broken, Chunk, End, Gap
from client.transport import ConnectionLost, DshClientError
from protocol.rpc import RpcError

__all__ = ["TerminalScreen", "TerminalView", "keys_to_bytes", "REPLAY_BYTES"]

_log = logging.getLogger(__name__)

#: How much of the retained output before its end is replayed into the emulator on attach.
REPLAY_BYTES = 256 * 1024
#: The most output bytes waiting to be fed to the emulator (older ones are skipped).
PENDING_BOUND = 256 * 1024
#: The most typed bytes waiting for ``tool.write`` (one request takes up to 1 MiB).
INPUT_BOUND = 64 * 1024
#: The most times a second output is fed to the emulator and redrawn.
REDRAWS_PER_S = 30

_KEYS = {
    "enter": b"\r", "tab": b"\t", "shift+tab": b"\x1b[Z", "backspace": b"\x7f",
    "ctrl+h": b"\x08", "escape": b"\x1b", "up": b"\x1b[A", "down": b"\x1b[B",
    "right": b"\x1b[C", "left": b"\x1b[D", "home": b"\x1b[H", "end": b"\x1b[F",
    "pageup": b"\x1b[5~", "pagedown": b"\x1b[6~", "insert": b"\x1b[2~", "delete": b"\x1b[3~",
    "f1": b"\x1bOP", "f2": b"\x1bOQ", "f3": b"\x1bOR", "f4": b"\x1bOS", "f5": b"\x1b[15~",
    "f6": b"\x1b[17~", "f7": b"\x1b[18~", "f8": b"\x1b[19~", "f9": b"\x1b[20~",
    "f10": b"\x1b[21~", "f11": b"\x1b[23~", "f12": b"\x1b[24~", "space": b" ",
    "ctrl+space": b"\x00", "ctrl+@": b"\x00",
}
_CTRL_PUNCT = {"[": 27, "\\": 28, "]": 29, "^": 30, "_": 31}


def keys_to_bytes(key: str, character: str | None) -> bytes:
    """The bytes a terminal sends for a Textual key (``event.key``, ``event.character``)."""
    if key in _KEYS:
        return _KEYS[key]
    if key.startswith("ctrl+") and len(key) == 6:
        rest = key[-1]
        if "a" <= rest <= "z":
            return bytes([ord(rest) - ord("a") + 1])
        if rest in _CTRL_PUNCT:
            return bytes([_CTRL_PUNCT[rest]])
    if character:
        return character.encode("utf-8", "surrogatepass")
    return b""


_NAMES = {"black": 0, "red": 1, "green": 2, "brown": 3, "yellow": 3, "blue": 4, "magenta": 5,
          "cyan": 6, "white": 7}


def _colour(name: str) -> Color | None:
    if name == "default":
        return None
    bright = name.startswith("bright")
    base = name[6:] if bright else name
    if base in _NAMES:
        return Color.from_ansi(_NAMES[base] + (8 if bright else 0))
    try:
        return Color.parse("#" + name)
    except Exception:  # noqa: BLE001 - an unknown colour name is drawn in the default colour
        return None


class _Screen(pyte.Screen):
    """pyte's screen, with private SGR (``CSI > ... m``, ``CSI ? ... m``) ignored."""

    def select_graphic_rendition(self, *attrs: int, private: bool = False) -> None:
        if not private:
            super().select_graphic_rendition(*attrs)


class _TolerantStream(pyte.ByteStream):
    """pyte's byte stream that skips a sequence pyte fails on instead of raising."""

    def __init__(self, screen: pyte.Screen) -> None:
        self.errors = 0
        super().__init__(screen)

    def _send_to_parser(self, data: str) -> bool | None:
        try:
            return super()._send_to_parser(data)  # pyte resets its parser on an exception
        except Exception:  # noqa: BLE001 - a program's bytes must not take the app down
            self._failed()
            return self._taking_plain_text

    def feed(self, data: bytes) -> None:  # type: ignore[override]
        try:
            super().feed(data)
        except Exception:  # noqa: BLE001 - e.g. draw() on a sequence pyte did not expect
            self._failed()
            self._initialize_parser()

    def _failed(self) -> None:
        self.errors += 1
        if self.errors <= 10 or self.errors % 1000 == 0:
            _log.warning("terminal emulator: a byte sequence was skipped (%d so far)",
                         self.errors, exc_info=True)


class TerminalView(Widget, can_focus=True):
    """A PTY call's screen, emulated by pyte (module doc)."""

    DEFAULT_CSS = "TerminalView { width: 1fr; height: 1fr; }"

    class Detached(Message):
        """The detach sequence was typed."""

    class Ended(Message):
        def __init__(self, exit_code: int | None) -> None:
            super().__init__()
            self.exit_code = exit_code

    def __init__(self, client: Any, session_id: str, call_id: str, *,
                 detach_keys: bytes = parse_detach_keys(DEFAULT_DETACH_KEYS),
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self._client_source = client
        self.session_id, self.call_id = session_id, call_id
        self.screen_model = _Screen(80, 24)
        self.screen_model.write_process_input = self._answer  # the program's queries
        self._stream = _TolerantStream(self.screen_model)
        self._scanner = DetachScanner(detach_keys)
        self._pending = bytearray()
        self._tick_pending = False
        self._outbox = bytearray()
        self._outbox_ready = asyncio.Event()
        self._styles: dict[tuple[Any, ...], Style] = {}
        self.position: int | None = None  # the next output offset the follow expects
        self.ended = False
        self.exit_code: int | None = None
        self.problem: str | None = None
        self.size_sent: tuple[int, int] | None = None  # the last (cols, rows) resized to

    @property
    def client(self) -> Any:
        source = self._client_source
        return source() if callable(source) else source

    def check_consume_key(self, key: str, character: str | None) -> bool:
        return True  # every key is the command's: no binding above takes one

    def on_mount(self) -> None:
        self._start_follow()
        self.run_worker(self._writer(), group="write", exit_on_error=False)

    def resume(self, client: Any) -> None:
        """Follow (and write) again on ``client``, from the next offset not received."""
        self._client_source = client
        self.problem = None
        if not self.ended:
            self._start_follow()
            self._outbox_ready.set()
            if self.size_sent is not None:
                self._send_size()

    # -- output -----------------------------------------------------------------------------
    def _start_follow(self) -> None:
        self.run_worker(self._follow(), group="follow", exclusive=True, exit_on_error=False)

    async def _follow(self) -> None:
        client = self.client
        try:
            if self.position is None:
                probe = await client.read_output(self.session_id, self.call_id, 0, 1,
                                                 from_first=True)
                self.position = max(probe.first_offset, probe.end_offset - REPLAY_BYTES)
            while not self.ended:
                async with await client.follow_output(self.session_id, self.call_id,
                                                      self.position) as follow:
                    async for item in follow:
                        if isinstance(item, Chunk):
                            self._receive(item.data)
                            self.position = item.offset + len(item.data)
                        elif isinstance(item, Gap):
                            self.position = item.to
                        elif isinstance(item, End):
                            self._end(item.exit_code)
                            return
                        elif isinstance(item, Broken):
                            self.position = item.offset
                            break
        except (ConnectionLost, RpcError, DshClientError) as exc:
            self.problem = str(exc)
            self.refresh()

    def _receive(self, data: bytes) -> None:
        self._pending += data
        extra = len(self._pending) - PENDING_BOUND
        if extra > 0:
            del self._pending[:extra]
        if not self._tick_pending:
            self._tick_pending = True
            self.set_timer(1 / REDRAWS_PER_S, self._tick)

    def _tick(self) -> None:
        self._tick_pending = False
        if self._pending:
            data = bytes(self._pending)
            self._pending.clear()
            self.feed_output(data)
        self.refresh()

    def feed_output(self, data: bytes) -> None:
        """Feed the program's bytes to the emulator (a sequence it fails on is skipped)."""
        self._stream.feed(data)

    @property
    def emulator_errors(self) -> int:
        """How many byte sequences the emulator failed on and skipped."""
        return self._stream.errors

    def _end(self, exit_code: int | None) -> None:
        self._tick()
        self.ended, self.exit_code = True, exit_code
        self.post_message(self.Ended(exit_code))

    def _answer(self, data: str) -> None:
        self._send(data.encode("utf-8", "surrogatepass"))

    # -- drawing ----------------------------------------------------------------------------
    def _style(self, char: Any) -> Style:
        key = (char.fg, char.bg, char.bold, char.italics, char.underscore, char.reverse,
               char.strikethrough)
        style = self._styles.get(key)
        if style is None:
            style = Style(color=_colour(char.fg), bgcolor=_colour(char.bg), bold=char.bold,
                          italic=char.italics, underline=char.underscore,
                          reverse=char.reverse, strike=char.strikethrough)
            if len(self._styles) > 4096:
                self._styles.clear()
            self._styles[key] = style
        return style

    def render_line(self, y: int) -> Strip:
        model = self.screen_model
        width = self.size.width
        if y >= model.lines:
            return Strip.blank(width)
        row = model.buffer[y]
        cursor = model.cursor
        show_cursor = not cursor.hidden and cursor.y == y and not self.ended
        segments: list[Segment] = []
        run: list[str] = []
        run_style: Style | None = None
        for x in range(model.columns):
            char = row[x]
            if char.data == "":
                continue  # the second cell of a wide character
            style = self._style(char)
            if show_cursor and x == cursor.x:
                style = style + Style(reverse=not char.reverse)
            if style != run_style and run:
                segments.append(Segment("".join(run), run_style))
                run = []
            run_style = style
            run.append(char.data)
        if run:
            segments.append(Segment("".join(run), run_style))
        return Strip(segments).crop_extend(0, width, None)

    # -- input ------------------------------------------------------------------------------
    async def on_key(self, event: events.Key) -> None:
        event.stop()
        event.prevent_default()
        if self.ended:
            self.post_message(self.Detached())
            return
        data = keys_to_bytes(event.key, event.character)
        if not data:
            return
        data, detach = self._scanner.feed(data)
        if data:
            self._send(data)
        if detach:
            self.post_message(self.Detached())

    def on_paste(self, event: events.Paste) -> None:
        event.stop()
        self._send(event.text.replace("\r\n", "\r").replace("\n", "\r").encode())

    def _send(self, data: bytes) -> None:
        if len(self._outbox) + len(data) > INPUT_BOUND:
            self.app.bell()  # the command does not read its input: typing more is dropped
            return
        self._outbox += data
        self._outbox_ready.set()

    async def _writer(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox and not self.ended:
                data = bytes(self._outbox)
                try:
                    await self.client.write_input(self.session_id, self.call_id, data)
                except (ConnectionLost, RpcError, DshClientError) as exc:
                    self.problem = str(exc)  # kept: resume() sends it on the new connection
                    break
                del self._outbox[:len(data)]

    # -- size -------------------------------------------------------------------------------
    def on_resize(self, event: events.Resize) -> None:
        cols, rows = max(1, event.size.width), max(1, event.size.height)
        if (cols, rows) != (self.screen_model.columns, self.screen_model.lines):
            self.screen_model.resize(lines=rows, columns=cols)
        self.size_sent = (cols, rows)
        self._send_size()
        self.refresh()

    def _send_size(self) -> None:
        self.run_worker(self._resize(*self.size_sent), group="resize", exclusive=True,
                        exit_on_error=False)

    async def _resize(self, cols: int, rows: int) -> None:
        try:
            await self.client.resize(self.session_id, self.call_id, cols, rows)
        except (ConnectionLost, RpcError, DshClientError):
            pass  # settled meanwhile, or the connection went: resume() sends it again


class TerminalScreen(Screen, inherit_bindings=False):
    """Full-screen attach to a PTY call; dismissed with ``"detached"`` or ``"ended"``."""

    DEFAULT_CSS = """
    TerminalScreen { layout: vertical; }
    TerminalScreen #attach-footer { dock: bottom; height: 1; background: $primary 40%; }
    """

    def __init__(self, client: Any, session_id: str, call_id: str, *,
                 detach_keys: bytes = parse_detach_keys(DEFAULT_DETACH_KEYS)) -> None:
        super().__init__()
        self.detach_keys = detach_keys
        self.terminal = TerminalView(client, session_id, call_id, detach_keys=detach_keys)

    def compose(self) -> Any:
        how = (f"{describe_keys(self.detach_keys).lower()} detaches (the command goes on)"
               if self.detach_keys else "no detach key: the screen returns when the call ends")
        yield Static(how, id="attach-footer")
        yield self.terminal

    def on_mount(self) -> None:
        self.terminal.focus()

    def resume(self, client: Any) -> None:
        self.terminal.resume(client)

    def on_terminal_view_detached(self, message: TerminalView.Detached) -> None:
        message.stop()
        if self.terminal.ended:
            self.app.clear_notifications()  # the "command ended" popup goes with the key
        self.dismiss("ended" if self.terminal.ended else "detached")

    def on_terminal_view_ended(self, message: TerminalView.Ended) -> None:
        message.stop()
        code = "?" if message.exit_code is None else message.exit_code
        self.notify(f"the command ended (exit {code}); any key returns", timeout=3)
        # The detach keys mean nothing now: the footer says how to go back instead.
        self.query_one("#attach-footer", Static).update(
            f"the command ended (exit {code}): any key returns to the main screen")
