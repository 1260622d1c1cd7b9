"""What a terminal may be shown of a string that came over the wire (``printable``).

Theory of operation: commands, titles, cwds, approval summaries, error messages, ids -- any
metadata the CLI prints -- came from dshd, and dshd holds what a client or a model sent. A
raw ESC, CSI (U+009B) or carriage return in one of them would let it rewrite the terminal
(``\\033[2K`` erases the line that shows the command). ``printable`` replaces every character
that is not printable (``str.isprintable``: C0 and C1 controls, DEL, ESC, line and paragraph
separators, bidi and other format characters, unassigned code points) with a visible
escape: ``\\n`` and ``\\t``, ``\\xNN`` below U+0100 (``\\x1b``, ``\\x0d``), else ``\\uNNNN`` or
``\\UNNNNNNNN``.
``keep`` names the few a caller lets through (a multi-line approval summary keeps ``\\n``
and ``\\t``). Every sink of metadata in
``client`` (``cli.terminal.note``, ``cli.chat._note``, table cells, headers, log lines) goes
through it, and so does ``python -m dshd fsck --offline`` (``dshd.storage.fsck_cli``), whose
lines must read as the client's.

A tool's *output* is not metadata: ``dsh run`` / ``dsh attach`` print it as the command wrote
it, escapes included (the user asked to see it), and never through this function.
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str, keep: str = "") -> str:
    """``text`` with every non-printable character but those in ``keep`` shown as an escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in keep else _escape(ch) for ch in text)


_SHORT = {"\n": "\\n", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
