"""OutputView against a real daemon, driven with Textual's Pilot (asyncio: tests.tui.termsupport).

A call's output shows live and with its colours; after a long output (``seq 1 2000000``) the
view shows its tail while the bytes it holds stay within the window's bound; Home/Page Up at
the top reads older output with ``tool.read`` and shows exactly the lines before; a view whose
connection is replaced resumes from the next offset (no line lost, none twice).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from client.api import connect
from client.tui.outputview import OutputView
from client.tui.tailbuffer import MAX_LINE_BYTES, MAX_WINDOW_BYTES, MAX_WINDOW_LINES
from tests.e2e.conftest import daemon, workdir  # noqa: F401 - fixtures
from tests.tui.termsupport import OneWidgetApp, run_async, screen_lines, until


def seq_offset(n: int) -> int:
    """Where the line of ``n`` starts in ``seq 1 N``'s output."""
    offset, digits, low = 0, 1, 1
    while low * 10 <= n:
        offset += (low * 10 - low) * (digits + 1)
        low, digits = low * 10, digits + 1
    return offset + (n - low) * (digits + 1)


def shown_numbers(view: OutputView) -> list[int]:
    return [int(t) for t in (line.strip() for line in screen_lines(view)) if t.isdigit()]


def test_seq_offset_is_where_seq_puts_the_line():
    data = "".join(f"{i}\n" for i in range(1, 2001)).encode()
    for n in (1, 9, 10, 99, 100, 1000, 2000):
        assert data[seq_offset(n):].split(b"\n", 1)[0] == str(n).encode()


def test_output_shows_live_with_colours(daemon, workdir):
    async def main() -> None:
        async with connect(daemon.socket) as client:
            sid = await client.create_session(workdir)
            cid = await client.run_tool(
                sid, "printf '\\033[31mred alert\\033[0m plain\\n'; "
                     "for i in $(seq 1 400); do echo tick-$i; sleep 0.05; done")
            view = OutputView(client, sid, cid)
            async with OneWidgetApp(view).run_test(size=(60, 12)) as pilot:
                await until(lambda: any("tick-3" in line for line in screen_lines(view)),
                            "tick-3 on screen", pilot=pilot)
                assert not view.ended, "the call should still be running: shown live"
                await pilot.press("home")
                await until(lambda: "red alert" in screen_lines(view)[0], "the first line",
                            pilot=pilot)
                strip = view.render_line(0)
                colours = {seg.text.strip(): seg.style.color.number for seg in strip
                           if seg.text.strip() and seg.style and seg.style.color}
                assert colours.get("red alert") == 1, list(strip)  # SGR 31: ANSI red
                assert colours.get("plain") != 1, "the colour ended with its reset"
                await client.cancel(sid, cid)
    run_async(main)


def test_tail_of_a_long_output_is_bounded_and_scrolls_back(daemon, workdir):
    async def main() -> None:
        async with connect(daemon.socket) as client:
            sid = await client.create_session(workdir)
            cid = await client.run_tool(sid, "seq 1 2000000")
            view = OutputView(client, sid, cid)
            peak = 0
            async with OneWidgetApp(view).run_test(size=(40, 20)) as pilot:
                def ended() -> bool:
                    nonlocal peak
                    peak = max(peak, view.held_bytes)
                    return view.ended and 2000000 in shown_numbers(view)
                await until(ended, "the tail (2000000) on screen", timeout=180, pilot=pilot)
                shown = shown_numbers(view)
                assert shown == list(range(shown[0], 2000001)) and len(shown) >= 15, shown
                assert peak <= 2 * MAX_WINDOW_BYTES + MAX_LINE_BYTES, peak
                assert len(view.window) <= MAX_WINDOW_LINES
                assert view.window.held_bytes <= MAX_WINDOW_BYTES
                oldest_held = int(view.window.text(0))
                assert oldest_held > 1, "the window holds the tail, not the whole output"
                assert view.window.start == seq_offset(oldest_held)

                # Home goes past the window's top: the range before it is read (tool.read).
                await pilot.press("home")
                await until(lambda: shown_numbers(view) and shown_numbers(view)[0] < oldest_held,
                            "older lines read on demand", pilot=pilot)
                shown = shown_numbers(view)
                assert shown == list(range(shown[0], shown[0] + len(shown))), shown
                assert view.scroll_y == 0
                texts = [view.window.text(i) for i in range(len(view.window))]
                numbers = [int(t) for t in texts]
                assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
                assert view.window.start == seq_offset(numbers[0]) and numbers[0] == shown[0]
                assert numbers[0] < oldest_held <= numbers[-1]
                assert view.held_bytes <= 2 * MAX_WINDOW_BYTES + MAX_LINE_BYTES

                # Page Up at the top reads again and moves up exactly one page into it.
                top = shown[0]
                await pilot.press("pageup")
                await until(lambda: shown_numbers(view)[:1] == [top - 20],
                            "one page above the old top", pilot=pilot)
                shown = shown_numbers(view)
                assert shown == list(range(top - 20, top)), shown

                # End follows the tail again.
                await pilot.press("end")
                await until(lambda: shown_numbers(view)[-1:] == [2000000], "the tail again",
                            pilot=pilot)
                assert view.following
    run_async(main)


def test_resume_on_a_new_connection_loses_no_line(daemon, workdir):
    async def main() -> None:
        async with AsyncExitStack() as first:
            client = await first.enter_async_context(connect(daemon.socket))
            sid = await client.create_session(workdir)
            cid = await client.run_tool(
                sid, "for i in $(seq 1 600); do echo n$i; sleep 0.005; done")
            view = OutputView(client, sid, cid)
            async with OneWidgetApp(view).run_test(size=(40, 10)) as pilot:
                await until(lambda: view.window.end and view.window.end > 100,
                            "some output", pilot=pilot)
                await first.aclose()  # the connection goes away mid-call
                await until(lambda: view.problem, "the lost connection noticed", pilot=pilot)
                before = view.position
                async with connect(daemon.socket) as second:
                    view.resume(second)
                    await until(lambda: view.ended, "the call's end", pilot=pilot)
                    await pilot.pause(0.2)
                assert view.position > before
                texts = [view.window.text(i) for i in range(len(view.window))]
                assert texts == [f"n{i}" for i in range(1, 601)]
    run_async(main)


def test_line_window_keeps_every_line_at_its_offset_within_its_bounds():
    """Random streams in random chunks (and a scroll-back step): every held line is the
    stream's bytes at its offset, the counts add up, the bounds hold."""
    import random

    from client.tui.tailbuffer import LineWindow

    rng = random.Random(17)
    for trial in range(400):
        w = LineWindow(max_bytes=rng.choice([50, 200, 5000]), max_lines=rng.choice([3, 10, 100]),
                       max_line=rng.choice([8, 64, 1000]))
        stream = b"".join(rng.choice([b"a", b"bb\n", b"\n", b"\xc3\xa9", b"c" * rng.randint(0, 30)])
                          for _ in range(rng.randint(1, 400)))
        pos = 0
        while pos < len(stream):
            n = rng.randint(1, rng.choice([60, 600]))
            w.append(pos, stream[pos:pos + n], line_start=pos == 0)
            pos += n
        assert w.end == len(stream)
        assert len(w.lines) <= w.max_lines and w.held_bytes <= w.max_bytes + w.max_line
        check_window(w, stream, trial)
        if w.lines and w.start:
            start = max(0, w.start - 40)
            w.prepend(start, stream[start:w.start], line_start=start == 0)
            check_window(w, stream, trial)


def check_window(w, stream: bytes, trial: int) -> None:
    ends = list(w.starts[1:]) + [w.partial_start if w.partial else w.end]
    for line, start, end in zip(w.lines, w.starts, ends):
        assert stream[start:start + len(line)] == line, trial
        assert end - start in (len(line), len(line) + 1), trial
    if w.partial:
        assert stream[w.partial_start:w.end] == bytes(w.partial), trial
    assert w.line_bytes == sum(e - s for s, e in zip(w.starts, ends)), trial
