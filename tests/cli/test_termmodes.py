"""``client.cli.termmodes``: what a command's output turned on is exactly what is undone --
a sequence cut between two chunks included, a mode turned off again left alone, and an
alternate screen never entered never left (that would move the cursor)."""

from __future__ import annotations

from client.cli.termmodes import TermModes


def test_a_plain_output_gives_back_only_the_cursor_and_attributes():
    modes = TermModes()
    modes.feed(b"hello \x1b[31mred\x1b[0m\n")
    assert modes.restore() == b"\x1b[?25h\x1b[0m"
    assert modes.restore(line_open=True) == b"\x1b[?25h\x1b[0m\r\n"


def test_modes_left_on_are_undone_alternate_screen_first():
    modes = TermModes()
    modes.feed(b"\x1b[?1000;1006h\x1b[?2004h\x1b=\x1b[?1")
    modes.feed(b"049h\x1b[?25l text")  # cut in two
    assert modes.alternate
    out = modes.restore(line_open=True)
    assert out.startswith(b"\x1b[?1049l")
    for undo in (b"\x1b[?1000l", b"\x1b[?1006l", b"\x1b[?2004l", b"\x1b>", b"\x1b[?25h"):
        assert undo in out
    assert not out.endswith(b"\r\n"), "the alternate screen left: the cursor is back"


def test_a_mode_the_output_turned_off_again_is_left_alone():
    modes = TermModes()
    modes.feed(b"\x1b[?1049h\x1b[?1002h\x1b=")
    modes.feed(b"\x1b[?1002l\x1b[?1049l\x1b>bye\n")
    assert modes.restore() == b"\x1b[?25h\x1b[0m"
