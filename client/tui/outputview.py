"""``OutputView``: one call's raw output, live, in a bounded window -- fast for 1 GiB outputs.

Theory of operation: the widget follows the call's raw channel (``tool.follow``, PROTOCOL.md
§3.2, through ``client.raw.OutputFollow``) from a little before the end of what is retained
(``INITIAL_REPLAY`` bytes: a long output is not replayed from byte 0), and keeps only a
``client.tui.tailbuffer.LineWindow`` of it: the last ``MAX_WINDOW_BYTES`` / ``MAX_WINDOW_LINES``
as lines at absolute offsets. Incoming chunks are not drawn one by one: they go to a pending
buffer (itself bounded by ``PENDING_BOUND``: a flood faster than the view keeps only its
newest bytes, and the window restarts at the next line after the skip) that a timer moves into
the window at most ``REDRAWS_PER_S`` times a second, so a flood costs a bounded amount of
work per frame and a keypress waits at most one such step. That step yields to input: while
the app holds unhandled messages (keys) or the screen has another widget's change to draw
(a key's effect), it waits a frame (``YIELD_FRAMES`` at most in a row), so the key's frame is
drawn without this view's repaint in it, and a redraw repaints only this view: the
scrollable size is set without a layout of the screen (``_size_virtual``). Once bytes had to be skipped (a
flood), the view stops following: ``FLOOD_REDRAWS_PER_S`` times a second it reads the last
``FLOOD_SAMPLE`` bytes before the end (``tool.read``), so what a flood costs this process no
longer grows with its rate; when the output grows by less than ``PENDING_BOUND`` between two
samples (or the call ended) it follows again, losslessly, from the last byte sampled. The
bytes skipped count in ``dropped_bytes`` and are read back by scroll-back.

The widget is a Textual line-API ``ScrollView``: ``render_line`` draws only the rows on
screen, each from its line's bytes decoded then and there, its ANSI colours parsed by
``rich.text.Text.from_ansi`` (each line on its own: a colour left on at a line's end is not
carried to the next), after a carriage return only what follows it (as a terminal overwrites
a progress line); drawn lines are cached by offset (``LINE_CACHE`` entries). While the view
is at the bottom it follows the end, with no scrollbar (Textual would draw it again on every
redraw); scrolled up it shows its scrollbar and stays on the lines it shows while the window
moves under it.

Scroll-back beyond the window: Page Up (or Up, Home) at the top reads the ``SCROLLBACK_READ``
bytes before the window with ``tool.read`` and puts them in front (the newest lines drop out
past a bound, and the window no longer reaches the end: live data waits in the bounded
pending buffer); End reloads the tail (``tool.read`` of the last ``INITIAL_REPLAY`` bytes up
to where the follow is, then what is pending) and follows again. Bytes the daemon no longer
has (the per-call disk cap, ``firstOffset``) end the scroll-back there.

The client is given (a ``client.api.Client``, or a callable returning the current one); when
the connection is replaced, ``resume(client)`` follows again from the next offset not yet
received: no byte is lost, none shown twice. The follow ends with the call's end
(``ended``, ``exit_code``; an ``OutputView.Ended`` message is posted). While the window has
fewer lines than a pane has rows, a change of its line count posts ``OutputView.Grew``: the
session pane shares its rows by them (``SessionPane.fit``), not only on lane batches.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

import anyio
from rich.segment import Segment
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from client.raw import READ_LIMIT, Broken, Chunk, End, Gap
from client.transport import ConnectionLost, DshClientError
from client.tui.ansi import output_line, visible_line
from client.tui.tailbuffer import MAX_WINDOW_BYTES, MAX_WINDOW_LINES, LineWindow
from protocol.rpc import RpcError

__all__ = ["OutputView", "INITIAL_REPLAY", "SCROLLBACK_READ", "REDRAWS_PER_S",
           "MAX_WINDOW_BYTES", "MAX_WINDOW_LINES"]

#: How much of the retained output before its end is replayed when the view opens (and when
#: End brings it back to the tail); older output is read on demand.
INITIAL_REPLAY = 256 * 1024
#: How much older output one scroll-back step reads (one ``tool.read``: <= READ_LIMIT).
SCROLLBACK_READ = 256 * 1024
#: The most times a second incoming output is moved into the window and redrawn.
REDRAWS_PER_S = 30
#: The most received bytes waiting for the next redraw. A flood faster than this a redraw
#: (7.5 MiB/s at 30 a second) keeps its newest bytes and skips the rest (more would cost a
#: key its frame); what was skipped is read again by scroll-back (End, Page Up).
PENDING_BOUND = 256 * 1024
#: Under a flood, how much of the output's end is read (``tool.read``) a redraw, and how many
#: redraws a second (a repaint costs several ms; text changing 10 times a second is as
#: unreadable as at 30, and the keys get the frames between).
FLOOD_SAMPLE = 64 * 1024
FLOOD_REDRAWS_PER_S = 10
#: How many drawn lines are kept (by offset) so that a redraw does not parse them again.
LINE_CACHE = 512
#: Output yields to input (module doc): a redraw of new output waits a frame at most this
#: many frames in a row (so a flood still shows while keys are held).
YIELD_FRAMES = 6
FRAME_S = 1 / 60
#: A line count below this (more rows than a pane has) posts ``Grew`` when it changes.
SHARE_LINES = 200

assert SCROLLBACK_READ <= READ_LIMIT and INITIAL_REPLAY <= READ_LIMIT


class OutputView(ScrollView, can_focus=True):
    """A call's raw output, following live, windowed (module doc)."""

    DEFAULT_CSS = """
    OutputView { height: 1fr; overflow-x: hidden; overflow-y: hidden; }
    """
    BINDINGS = [
        Binding("up", "line_up", "Up", show=False),
        Binding("down", "line_down", "Down", show=False),
        Binding("pageup", "page_up_older", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home", "home_older", "Oldest", show=False),
        Binding("end", "tail", "Follow the end", show=False),
    ]

    class Ended(Message):
        """The call ended and every byte of its output was received."""

        def __init__(self, view: "OutputView", exit_code: int | None) -> None:
            super().__init__()
            self.view, self.exit_code = view, exit_code

    class Grew(Message):
        """The line count changed below ``SHARE_LINES``: rows shared by it are shared again."""

    def __init__(self, client: Any, session_id: str, call_id: str, *, name: str | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._client_source: Any = client
        self.session_id, self.call_id = session_id, call_id
        self.window = LineWindow()
        self._pending: deque[bytes] = deque()  # received chunks not yet in the window
        self._pending_bytes = 0
        self._pending_start: int | None = None
        #: The offset of the next byte the follow expects (None until it started).
        self.position: int | None = None
        #: The oldest offset the daemon still has (the per-call disk cap may drop older).
        self.first_offset = 0
        self.ended = False
        self.exit_code: int | None = None
        #: Why following stopped other than by the call's end (None: it did not).
        self.problem: str | None = None
        self.dropped_bytes = 0  # bytes never shown: gaps, and floods the view skipped
        #: Output comes faster than a redraw takes it: the tail is sampled (module doc).
        self.flooding = False
        self._following = True  # ``following``: the scrollbar is hidden (CSS) while it is
        self._tick_pending = False
        self._yielded = 0  # frames in a row the redraw of new output waited for input
        self._busy = False  # a tool.read for scroll-back or End is under way
        self._cache: OrderedDict[tuple[int, int], Strip] = OrderedDict()
        self._style: Any = None  # the widget's rich style of the redraw under way
        self._width: int | None = None  # and its width in cells

    @property
    def following(self) -> bool:
        """The view sits at the bottom and moves with new output (until scrolled up)."""
        return self._following

    @following.setter
    def following(self, value: bool) -> None:
        if value != self._following:
            self._following = value
            # The scrollbar only while scrolled back (module doc): at the end it tells nothing,
            # and Textual draws it again on every redraw, costly as the rows under a flood.
            self.styles.overflow_y = "hidden" if value else "auto"

    @property
    def allow_vertical_scroll(self) -> bool:
        """Scrolling is the view's own, scrollbar shown or not (Textual ties the two)."""
        return not self._check_disabled()

    # -- the client and the follow ----------------------------------------------------------
    @property
    def client(self) -> Any:
        source = self._client_source
        return source() if callable(source) else source

    @property
    def held_bytes(self) -> int:
        """Output bytes held in memory: the window and the pending buffer (both bounded)."""
        return self.window.held_bytes + self._pending_bytes

    def on_mount(self) -> None:
        self._start_follow()

    def resume(self, client: Any) -> None:
        """Follow again on ``client`` (a new connection) from the next offset not received."""
        self._client_source = client
        self.problem = None
        if not self.ended:
            self._start_follow()

    def _start_follow(self) -> None:
        self.run_worker(self._follow(), group="follow", exclusive=True, exit_on_error=False)

    async def _follow(self) -> None:
        client = self.client
        try:
            if self.position is None:
                probe = await client.read_output(self.session_id, self.call_id, 0, 1,
                                                 from_first=True)
                self.first_offset = probe.first_offset
                self.position = max(probe.first_offset, probe.end_offset - INITIAL_REPLAY)
            while not self.ended:
                if self.flooding:
                    await self._sample_tail(client)
                    continue
                follow = await client.follow_output(self.session_id, self.call_id,
                                                    self.position)
                async with follow:
                    if not await self._drain(follow):
                        return
        except ConnectionLost as exc:
            self.problem = f"connection lost: {exc}"  # resume() follows on
        except (RpcError, DshClientError) as exc:
            self.problem = str(exc)
        self.refresh()

    async def _drain(self, follow: Any) -> bool:
        """Take one follow's items; True to go on (Broken, or a flood), False at the end."""
        async for item in follow:
            if isinstance(item, Chunk):
                self._receive(item.offset, item.data)
                if self.flooding:
                    return True
            elif isinstance(item, Gap):
                self.dropped_bytes += item.to - item.start
                self.first_offset = max(self.first_offset, item.to)
                self.position = item.to
            elif isinstance(item, End):
                self.ended, self.exit_code = True, item.exit_code
                self._schedule()
                self.post_message(self.Ended(self, item.exit_code))
                return False
            elif isinstance(item, Broken):
                self.position = item.offset
                return True
        return False

    async def _sample_tail(self, client: Any) -> None:
        """A flood: the last ``FLOOD_SAMPLE`` bytes before the end, read each redraw, until
        the output grows by less than ``PENDING_BOUND`` a redraw (module doc)."""
        while True:
            await anyio.sleep(1 / FLOOD_REDRAWS_PER_S)
            probe = await client.read_output(self.session_id, self.call_id,
                                             self.position or 0, 1, from_first=True)
            self.first_offset = probe.first_offset
            end = probe.end_offset
            if end - (self.position or 0) <= PENDING_BOUND or probe.eof:
                self.flooding = False
                return
            start = max(probe.first_offset, end - FLOOD_SAMPLE)
            piece = await client.read_output(self.session_id, self.call_id, start,
                                             end - start)
            self._receive(piece.offset, piece.data)

    def _receive(self, offset: int, data: bytes) -> None:
        if self.position is not None and offset > self.position:
            self.dropped_bytes += offset - self.position  # skipped: a flood's sample
        if self._pending_start is None or self._pending_start + self._pending_bytes != offset:
            self._drop_pending()  # the first chunk, or one after a gap
            self._pending_start = offset
        self._pending.append(data)
        self._pending_bytes += len(data)
        self.position = offset + len(data)
        while len(self._pending) > 1 and self._pending_bytes - len(self._pending[0]) \
                >= PENDING_BOUND:  # more than a redraw takes: keep the newest bytes
            skipped = self._pending.popleft()
            self._pending_bytes -= len(skipped)
            self._pending_start += len(skipped)
            self.dropped_bytes += len(skipped)
            self.flooding = True
        self._schedule()

    def _drop_pending(self) -> None:
        self._pending.clear()
        self._pending_bytes = 0
        self._pending_start = None

    def _schedule(self, delay: float = 1 / REDRAWS_PER_S) -> None:
        if not self._tick_pending:
            self._tick_pending = True
            self.set_timer(delay, self._tick)

    def _tick(self) -> None:
        self._tick_pending = False
        if self._busy or not self.window.at_tail:
            return  # kept (bounded) until the view follows the end again
        if self._pending and self._yielded < YIELD_FRAMES and self._input_waits():
            self._yielded += 1
            self._schedule(FRAME_S)  # the key's frame first, without this view's repaint
            return
        self._yielded = 0
        self._apply_pending()

    def _input_waits(self) -> bool:
        """A key is on its way to the screen: the app, the focused widget or the screen has
        messages not yet handled, or a change not yet drawn (Textual's queues and refresh
        flags: it has no public way to ask)."""
        app, screen = self.app, self.screen
        focused = app.focused
        for pump in (app, screen, focused):
            if pump is not None and pump is not self and not pump._message_queue.empty():
                return True
        if focused is not None and focused is not self and (
                focused._repaint_required or focused._layout_required):
            return True
        dirty = screen._dirty_widgets
        return bool(screen._layout_required or (dirty and not dirty <= {self}))

    def _apply_pending(self) -> None:
        if self._pending_start is None or not self._pending:
            self.refresh()
            return
        at_end = self.following
        start = self._pending_start
        first = start == self.first_offset or start == 0
        data = b"".join(self._pending)
        self._drop_pending()
        dropped = self.window.append(start, data, line_start=first)
        self._relayout(at_end, -dropped)

    def _relayout(self, at_end: bool, shift: int) -> None:
        self._size_virtual()
        if at_end:
            self._to_bottom()
        elif shift:
            self.scroll_to(y=max(0, self.scroll_y + shift), animate=False, immediate=True)
        self.refresh()

    def _size_virtual(self) -> None:
        """The scrollable size follows the window's line count, set without a layout (the
        view's own size does not depend on it; a layout of the screen on every redraw cost a
        flood's frames tens of ms); the scrollbars are updated here instead."""
        size = Size(self.scrollable_content_region.width, len(self.window))
        if size.height != self.virtual_size.height and min(size.height, self.virtual_size.height) \
                < SHARE_LINES:
            self.post_message(self.Grew())
        if size != self.virtual_size:
            self.set_reactive(ScrollView.virtual_size, size)
            self._scroll_update(size)

    def _to_bottom(self) -> None:
        self.following = True
        self.scroll_to(y=max(0, len(self.window) - self.scrollable_content_region.height),
                       animate=False, immediate=True)

    # -- drawing ----------------------------------------------------------------------------
    def render_lines(self, crop: Any) -> list[Strip]:
        # Once per redraw, not per line (neither is cheap: Textual computes them each time).
        self._style = self.rich_style
        self._width = self.scrollable_content_region.width
        try:
            return super().render_lines(crop)
        finally:
            self._style = self._width = None

    def render_line(self, y: int) -> Strip:
        width = self._width if self._width is not None \
            else self.scrollable_content_region.width
        index = self.scroll_offset.y + y
        style = self._style if self._style is not None else self.rich_style
        if index >= len(self.window):
            if index == len(self.window) and self.problem:
                return Strip([Segment(visible_line(f"[{self.problem}]"), style)]).crop_extend(0, width, style)
            return Strip.blank(width, style)
        complete = index < len(self.window.lines)
        key = (self.window.line_offset(index), width)
        strip = self._cache.get(key) if complete else None
        if strip is None:
            strip = self._draw(self.window.text(index), width, style)
            if complete:
                self._cache[key] = strip
                while len(self._cache) > LINE_CACHE:
                    self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return strip.apply_offsets(0, index)

    def _draw(self, line: str, width: int, style: Any) -> Strip:
        """One line as ``width`` cells: plain printable ASCII (a flood's usual line) the
        cheap way, anything else through ``Text.from_ansi``."""
        if line.isascii() and line.isprintable():
            cells = line[:width]
            return Strip([Segment(cells.ljust(width), style)], width)
        text = output_line(line)
        text.stylize_before(style)  # under the ANSI colours
        return Strip(text.render(self.app.console), text.cell_len).crop_extend(0, width, style)

    def on_resize(self) -> None:
        self._size_virtual()
        if self.following:
            self._to_bottom()

    # -- keys: scroll, scroll back, follow --------------------------------------------------
    def _move(self, rows: int) -> None:
        """Scroll by ``rows`` (negative: up); past the top, read older output, then go on."""
        beyond = self.scroll_y + rows
        if rows < 0 and beyond < 0:
            self._load_older(beyond)
        self.scroll_to(y=max(0, min(self.scroll_y + rows, self.max_scroll_y)), animate=False,
                       immediate=True)
        self.following = self.window.at_tail and self.scroll_y >= self.max_scroll_y
        self.refresh()

    def action_line_up(self) -> None:
        self._move(-1)

    def action_line_down(self) -> None:
        self._move(1)

    def action_page_up_older(self) -> None:
        self._move(-self.scrollable_content_region.height)

    def action_page_down(self) -> None:
        self._move(self.scrollable_content_region.height)

    def action_home_older(self) -> None:
        self._move(-(1 << 40))  # the top of the window, and of what one more read adds

    def _on_mouse_scroll_up(self, event: Any) -> None:
        self._move(-3)
        event.stop()

    def _on_mouse_scroll_down(self, event: Any) -> None:
        self._move(3)
        event.stop()

    def action_tail(self) -> None:
        if self.window.at_tail:
            self._apply_pending()
            self._to_bottom()
        elif not self._busy:
            self._busy = True
            self.run_worker(self._reload_tail(), group="read", exit_on_error=False)

    @property
    def can_scroll_back(self) -> bool:
        start = self.window.start
        return start is not None and start > self.first_offset

    def _load_older(self, rows: int) -> None:
        """Read older output; then show it ``rows`` (< 0) above the current top line."""
        if self.can_scroll_back and not self._busy:
            self._busy = True
            self.run_worker(self._read_older(rows), group="read", exit_on_error=False)

    async def _read_exact(self, start: int, stop: int) -> bytes:
        parts, at = [], start
        while at < stop:
            piece = await self.client.read_output(self.session_id, self.call_id, at, stop - at)
            if not piece.data:
                break
            parts.append(piece.data)
            at += len(piece.data)
        return b"".join(parts)

    async def _read_older(self, rows: int) -> None:
        """Scroll-back: the ``SCROLLBACK_READ`` bytes before the window, put in front."""
        try:
            stop = self.window.start
            if stop is None:
                return
            start = max(self.first_offset, stop - SCROLLBACK_READ)
            try:
                data = await self._read_exact(start, stop)
            except RpcError as exc:  # the disk cap dropped it meanwhile
                first = exc.data.get("firstOffset") if isinstance(exc.data, dict) else None
                self.first_offset = first if isinstance(first, int) else stop
                return
            if len(data) != stop - start or self.window.start != stop:
                return  # the window moved meanwhile: the next Page Up reads again
            added = self.window.prepend(start, data, line_start=start == self.first_offset)
            self._size_virtual()
            self.following = False
            self.scroll_to(y=max(0, self.scroll_y + added + rows), animate=False,
                           immediate=True)
            self.refresh()
        except (ConnectionLost, DshClientError) as exc:
            self.problem = str(exc)
        finally:
            self._busy = False

    async def _reload_tail(self) -> None:
        """End after scrolling back: the window becomes the tail again, then follows."""
        try:
            stop = self.position if self.position is not None else 0
            start = max(self.first_offset, stop - INITIAL_REPLAY)
            data = await self._read_exact(start, stop)
            self.window.clear()
            self.window.append(start, data, line_start=start == self.first_offset)
            self._relayout(True, 0)
        except (RpcError, ConnectionLost, DshClientError) as exc:
            self.problem = str(exc)
        finally:
            self._busy = False
        self._apply_pending()
        self._to_bottom()
