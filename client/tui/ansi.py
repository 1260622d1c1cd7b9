"""What of a program's output a preview may draw: text and SGR colours, nothing else.

Theory of operation: a call's preview (``client.tui.calls``, ``client.tui.outputview``) draws
output lines with ``rich.text.Text.from_ansi``, which knows SGR but prints the body of other
sequences: a window title (OSC ``ESC ] 0;title BEL``) showed as ``0;title``, a DCS as its
parameters. :func:`strip_controls` removes, in one regex pass, OSC (ended by BEL or ST, or
unended: to the end of the text), DCS/SOS/PM/APC strings, every CSI that is not a plain SGR
(``ESC [ digits;… m``: cursor movement, erase, modes, private SGR such as ``ESC[>4;2m``),
other escapes (``ESC ( B``, ``ESC 7``), 8-bit C1 controls and C0 controls but tab, line feed
and carriage return (the line view handles ``\\r``); the bidi embeddings, overrides and
isolates (U+202A-202E, U+2066-2069), which would reorder the rest of a line so that it reads
as something else, show as ``\\uXXXX`` escapes. A full terminal is the attach screen.
:func:`visible_text` is for text a person decides on (an approval's command): every character
that reorders or hides text (bidi overrides and isolates, zero-width ones, controls) becomes a
``\\uXXXX`` escape, as ``dsh approvals`` shows it; it also escapes the line and paragraph
separators (U+2028, U+2029: a line break in some terminals) and the Hangul fillers (U+115F,
U+1160, U+3164, U+FFA0: they render blank). :func:`visible_line` is the same for a one-line
label (a session's name or title, a cwd, a command in a one-line row): line feeds and tabs
become spaces first. :func:`label` is ``visible_line`` with Rich/Textual markup escaped, for
the widgets that parse a str as markup (``DataTable`` cells, ``border_title``): a title
``[reverse]…`` must show as typed. Every string the TUI draws that came from dshd, the model
or another user goes through one of these (output through ``strip_controls``).
"""

from __future__ import annotations

import re

from rich.markup import escape
from rich.text import Text

__all__ = ["strip_controls", "output_line", "visible_text", "visible_line", "label"]

_CONTROLS = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\|$)"      # OSC
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\|$)"         # DCS, SOS, PM, APC
    r"|(\x1b\[[0-9;:]*m)"                      # SGR: kept (group 1)
    r"|\x1b\[[0-?]*[ -/]*[@-~]"                # any other CSI
    r"|\x1b[ -/]*[0-~]"                        # other escapes
    r"|\x1b$"                                  # a lone ESC at the end
    r"|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f\x80-\x9f]"
    "|([\u202a-\u202e\u2066-\u2069])")      # bidi embeddings, overrides, isolates: shown


def _kept(match: re.Match) -> str:
    sgr, bidi = match.group(1, 2)
    return sgr or (f"\\u{ord(bidi):04x}" if bidi else "")


def strip_controls(text: str) -> str:
    """``text`` with every control sequence but SGR removed, and the bidi controls that
    reorder what follows them shown as ``\\uXXXX`` (module doc)."""
    if "\x1b" not in text and text.isprintable():
        return text
    return _CONTROLS.sub(_kept, text)


def output_line(line: str) -> Text:
    """One line of output as drawn: after a carriage return only what follows it (as a
    terminal overwrites a progress line), SGR colours kept, tabs expanded."""
    if "\r" in line:
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    text = Text.from_ansi(strip_controls(line), no_wrap=True, end="")
    if "\t" in line:
        text.expand_tabs()
    return text


# Bidi embeddings, overrides, isolates and marks, zero-width characters, line and paragraph
# separators, Hangul fillers, controls but \n and \t (client/web/static: visibleText, the same).
_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u115f\u1160\u200b-\u200f"
                        "\u2028-\u202e\u2060-\u2069\u3164\ufeff\uffa0]")


def visible_text(text: str) -> str:
    """``text`` with every invisible or reordering character as a ``\\uXXXX`` escape (module doc):
    what a person approves must read as what runs."""
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def visible_line(text: object) -> str:
    """``visible_text`` of ``text`` on one line: line feeds and tabs as spaces."""
    return visible_text(str(text).replace("\n", " ").replace("\t", " "))


def label(text: object) -> str:
    """``visible_line`` with markup escaped, for a widget that reads a str as markup."""
    return escape(visible_line(text))
