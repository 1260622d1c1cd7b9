"""A call's preview shows its text and colours, not its screen-drawing sequences (issue 17,
tuifix2 item 4): the window title (OSC ``ESC ] 0;… BEL``) showed as ``0;tester16@vm: ~/…``.
OSC, DCS, cursor movement and other non-SGR escapes are dropped; SGR colours are kept."""

from __future__ import annotations

from rich.text import Text

from client.tui.app import DshApp
from tests.tui.conftest import run_app, screen_text, until
from tests.tui.helpers import call_texts

TITLE = "\x1b]0;tester16@vm: ~/src/cproj\x07"


def test_strip_controls_keeps_sgr_and_drops_the_rest():
    from client.tui.ansi import strip_controls

    line = (TITLE + "\x1b]2;other\x1b\\a\x1b[2J\x1b[H\x1b[?2004hb\x1bP1;2q\x1b\\c\x1b(B"
            "\x1b[31mred\x1b[0m\x1b[38;5;2mg\x1b[m\x1b[>4;2m\x07\x08d\x9b1m")
    cleaned = strip_controls(line)
    # (the 8-bit CSI \x9b goes; the "1m" after it is text)
    assert cleaned == "abc\x1b[31mred\x1b[0m\x1b[38;5;2mg\x1b[md1m", repr(cleaned)
    text = Text.from_ansi(cleaned)
    assert text.plain.startswith("abcredgd")
    assert any(span.style.color and span.style.color.number == 1 for span in text.spans
               if not isinstance(span.style, str))  # SGR 31 kept: red
    assert strip_controls("\x1b]0;unterminated title") == ""
    assert strip_controls("plain\ttext\r\n") == "plain\ttext\r\n"


def test_bidi_controls_in_output_show_as_escapes():
    """An override or isolate would make the rest of the line read as something else (the
    "Trojan Source" trick: ``rm -rf`` shown reversed); each shows as its escape, while
    right-to-left text itself and other non-ASCII text are drawn as they are."""
    from client.tui.ansi import strip_controls

    line = "ok \u202eflog\u202c \u2066isolated\u2069 \u202a\u202b\u202d \u05e9\u05dc\u05d5\u05dd é"
    assert strip_controls(line) == ("ok \\u202eflog\\u202c \\u2066isolated\\u2069 "
                                    "\\u202a\\u202b\\u202d \u05e9\u05dc\u05d5\u05dd é")
    assert strip_controls("\x1b[31m\u202e\x1b[0m") == "\x1b[31m\\u202e\x1b[0m"


def test_a_calls_preview_has_no_title_leftovers(daemon, workdir):
    gate = workdir / "go"
    script = ("printf '\\033]0;tester16@vm: ~/src/cproj\\007visible-line "
              "\\033[31mred-word\\033[0m\\033[2K\\n'; "
              "printf 'bidi-line \\342\\200\\256reversed\\n'; "  # U+202E in UTF-8
              f"while [ ! -e {gate} ]; do sleep 0.05; done")
    app = DshApp(socket=daemon.socket)

    async def scenario(pilot):
        await until(pilot, lambda: app.feed.client is not None, "connected")
        proc = daemon.dsh_popen("run", "--name", "osc", "--", "sh", "-c", script,
                                cwd=str(workdir))
        try:
            await until(pilot, lambda: any("visible-line" in t for t in call_texts(app).values()),
                        "the call's output received")
            await until(pilot, lambda: "visible-line red-word" in screen_text(app),
                        "the line drawn")
            shown = screen_text(app)
            rows = [line.strip("│ ") for line in shown.splitlines()
                    if "visible-line red-word" in line]  # output rows (not the $ command)
            assert rows and all(row.startswith("visible-line red-word") for row in rows), shown
            await until(pilot, lambda: "bidi-line \\u202ereversed" in screen_text(app),
                        "the override shown as its escape")
            assert "\u202e" not in screen_text(app)
        finally:
            gate.write_text("")
            proc.wait(timeout=60)

    run_app(app, scenario)
