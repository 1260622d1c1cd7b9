"""The attach screen survives whatever bytes a program writes (issue 17, tuifix2 item 1).

vim writes xterm's modifyOtherKeys queries (``ESC[>4;2m``, ``ESC[>4;m``, ``ESC[?4m``): private
SGR sequences pyte 0.8's ``Screen.select_graphic_rendition`` refused with a ``TypeError`` that
took the whole TUI down (and the keys typed next went to the login shell). The emulator now
ignores private SGR, and any other exception of the emulator is logged and the bad sequence
skipped: the screen goes on with the bytes after it.
"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from client.api import connect
from client.tui.term import TerminalScreen, TerminalView
from tests.e2e.conftest import daemon, workdir  # noqa: F401 - fixtures
from tests.tui.termsupport import ScreenHostApp, run_async, terminal_text, until

VIM_SEQUENCES = b"\033[>4;2m\033[>4;m\033[?4m"


def test_private_sgr_is_ignored_and_the_text_after_it_shows():
    view = TerminalView(None, "s", "c")
    view.feed_output(b"\033[31mred\033[0m " + VIM_SEQUENCES + b"ok\r\n")
    assert terminal_text(view).splitlines()[0] == "red ok"
    assert view.screen_model.buffer[0][0].fg == "red"  # ordinary SGR still applies
    assert view.emulator_errors == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=64), st.sampled_from(
    [b"\033[", b"\033]", b"\033P", b"\033[?", b"\033[>", b";", b"m", b"h", b"l", b"J",
     b"\x07", b"\033\\", b"\x9b", b"1", b"99999999999"])), max_size=40))
def test_no_byte_sequence_raises_out_of_the_emulator(chunks):
    view = TerminalView(None, "s", "c")
    for chunk in chunks:
        view.feed_output(chunk)
    # End an open string (OSC/DCS: a real terminal waits for its end too), reset, draw.
    view.feed_output(b"\x07\033\\\x18\033c\r\nalive-after")
    assert "alive-after" in terminal_text(view)


def test_attaching_to_a_call_that_wrote_vims_sequences_keeps_the_app(daemon, workdir):
    async def main() -> None:
        async with connect(daemon.socket) as client:
            sid = await client.create_session(workdir)
            started = await client.start_tool(
                sid, "printf '\\033[>4;2m\\033[>4;m\\033[?4mok-after\\n'; cat", tty=(80, 24))
            cid = started.call_id
            screen = TerminalScreen(client, sid, cid)
            app = ScreenHostApp(screen)
            async with app.run_test(size=(80, 24)) as pilot:
                view = screen.terminal
                await until(lambda: "ok-after" in terminal_text(view), "ok-after", pilot=pilot)
                await pilot.press(*"typed", "enter")
                await until(lambda: terminal_text(view).count("typed") >= 2,
                            "keys reached cat", pilot=pilot)
                assert app.is_running and app.screen is screen
                await client.cancel(sid, cid)
    run_async(main)
