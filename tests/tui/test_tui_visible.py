"""What the approvals bar shows of a command is what runs: a right-to-left override (U+202E)
made ``: \\u202e ; touch SPOOFED # ohce`` read as an ``echo`` in a terminal that reorders bidi
text (an outside attacker's finding, web and TUI alike); invisible and control characters are
shown as escapes, as ``dsh approvals`` shows them."""

from __future__ import annotations

from client.tui.ansi import visible_text
from client.tui.approvals import request_text


def test_bidi_and_invisible_characters_show_as_escapes():
    assert visible_text(": \u202e ; touch x # ohce") == ": \\u202e ; touch x # ohce"
    for c in "\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u200b\ufeff\x07\x1b":
        assert c not in visible_text(f"a{c}b"), hex(ord(c))
    assert visible_text("line1\nline2\tx ünï 漢字") == "line1\nline2\tx ünï 漢字"


def test_separators_and_blank_hangul_fillers_show_as_escapes():
    """U+2028/U+2029 break a line in some terminals; the Hangul fillers render as blank: the
    same set as the web page's visibleText (tests/web/page/visible.test.mjs)."""
    for c in "\u2028\u2029\u115f\u1160\u3164\uffa0":
        assert visible_text(f"a{c}b") == f"a\\u{ord(c):04x}b", hex(ord(c))


def test_the_request_line_makes_the_command_visible():
    text = request_text({"tool": "bash", "summary": ": \u202e ; touch SPOOFED # ohce"})
    assert "\u202e" not in text.plain and "\\u202e ; touch SPOOFED" in text.plain
