"""The local terminal's modes that a command under a PTY turned on, and how to turn them off.

Theory of operation: while ``dsh run -t`` (or ``dsh attach`` of a tty call) prints a
command's output, the bytes go to this terminal as they are, so a full-screen program sets
this terminal's modes: the alternate screen (vim, less, top), a hidden cursor, mouse and
focus reporting, bracketed paste, application cursor keys and keypad, colours. When dsh
leaves the command -- a detach (Ctrl-P Ctrl-Q, SIGTERM, SIGHUP), or the command's end
without its own clean-up (killed, crashed) -- the person's terminal must be theirs again.
``TermModes.feed`` reads the printed output for the sequences that set and reset those
modes (DEC private modes ``ESC [ ? Pm h`` / ``l`` -- several ``;``-separated, a sequence
cut between two chunks is kept until the next -- and the keypad's ``ESC =`` / ``ESC >``) and
keeps the ones left on; ``restore`` is the bytes that undo exactly those, then show the
cursor and reset the attributes (both harmless when already so). Only modes seen on are
undone: leaving an alternate screen that was never entered would move the cursor (xterm's
``?1049l`` restores a cursor never saved: home). The alternate screen left, the cursor is
back where the program found it (``?1049`` saved it), on a line of its own; otherwise, when
the output left its last line open, ``restore`` ends it, so the next line dsh prints starts
at column 0. Output from before where the follow started (``dsh attach --tail``, bytes the
disk cap dropped) is not seen: what it set is not undone.
"""

from __future__ import annotations

import re

__all__ = ["TermModes", "RESET_TO"]

#: The DEC private modes undone on leaving, each with the setting it goes back to ("h" on,
#: "l" off): the alternate screens, the cursor shown, mouse and focus reporting, bracketed
#: paste, application cursor keys, autowrap.
RESET_TO: dict[int, str] = {
    1049: "l", 1047: "l", 47: "l",
    25: "h",
    9: "l", 1000: "l", 1001: "l", 1002: "l", 1003: "l", 1004: "l", 1005: "l", 1006: "l",
    1015: "l", 1016: "l",
    2004: "l",
    1: "l",
    7: "h",
}
#: The alternate screens, undone first (the other modes then apply to the normal screen).
_ALTERNATE = (1049, 1047, 47)
_SEQUENCE = re.compile(rb"\x1b\[\?([0-9;]*)([hl])|\x1b([=>])")
#: The longest tail of a chunk kept for a sequence cut off at its end.
_TAIL = 32


class TermModes:
    """The modes the output left in a state other than the terminal's usual one."""

    def __init__(self) -> None:
        self.changed: dict[int, str] = {}  # mode -> "h"/"l" as the output last set it
        self.keypad = False  # ESC = (application keypad) last, not ESC >
        self._tail = b""

    def feed(self, data: bytes) -> None:
        """Read one chunk of the output as printed."""
        if not data:
            return
        text = self._tail + data
        self._tail = b""
        end = 0
        if b"\x1b" in text:
            for found in _SEQUENCE.finditer(text):
                end = found.end()
                params, action, keypad = found.groups()
                if keypad is not None:
                    self.keypad = keypad == b"="
                    continue
                for part in params.split(b";"):
                    if part.isdigit() and int(part) in RESET_TO:
                        mode = int(part)
                        if action.decode() == RESET_TO[mode]:
                            self.changed.pop(mode, None)
                        else:
                            self.changed[mode] = action.decode()
            cut = text.rfind(b"\x1b", end)
            if cut >= 0 and len(text) - cut < _TAIL:
                self._tail = text[cut:]  # perhaps a sequence cut in two: read it whole

    @property
    def alternate(self) -> bool:
        return any(mode in self.changed for mode in _ALTERNATE)

    def restore(self, line_open: bool = False) -> bytes:
        """The bytes that give the terminal back (module doc); ``line_open``: the output
        printed last did not end its line."""
        out = [f"\x1b[?{mode}{RESET_TO[mode]}" for mode in _ALTERNATE if mode in self.changed]
        out += [f"\x1b[?{mode}{RESET_TO[mode]}" for mode in self.changed
                if mode not in _ALTERNATE and mode != 25]
        if self.keypad:
            out.append("\x1b>")
        out.append("\x1b[?25h\x1b[0m")
        if line_open and not self.alternate:
            out.append("\r\n")
        return "".join(out).encode()
