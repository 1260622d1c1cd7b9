"""The detach sequence of ``dsh run -t`` / ``dsh attach``: parsing it and finding it in keys.

Theory of operation: under a PTY every key goes to the command, so leaving it running takes a
sequence the command is unlikely to want, docker's ``Ctrl-P Ctrl-Q`` by default.
``parse_detach_keys`` reads docker's ``--detach-keys`` format: comma-separated keys, each one
character (``a``; spaces around a key are ignored, and ``,`` cannot be one) or ``ctrl-X`` for X in ``a``..``z``, ``@``, ``[``,
``\\``, ``]``, ``^``, ``_`` (case-insensitive); the empty string turns detaching off.
``DetachScanner`` watches the key stream: bytes that could start the sequence are held back;
the whole sequence detaches (it never reaches the command); a held prefix followed by another
key goes to the command as typed (docker's rule), so ``Ctrl-P`` alone still works in a shell.
Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_DETACH_KEYS", "parse_detach_keys", "describe_keys", "DetachScanner",
           "detach_keys_option"]

DEFAULT_DETACH_KEYS = "ctrl-p,ctrl-q"
_CTRL_SPECIAL = {"@": 0, "[": 27, "\\": 28, "]": 29, "^": 30, "_": 31}
#: The longest detach sequence accepted (keys).
MAX_KEYS = 16


def parse_detach_keys(spec: str) -> bytes:
    """The bytes of a ``--detach-keys`` value (module doc); ``ValueError`` says what is wrong."""
    if spec == "":
        return b""
    out = bytearray()
    for key in spec.split(","):
        name = key.strip().lower()
        if len(name) > 1 and name.startswith("ctrl-"):
            rest = name[len("ctrl-"):]
            if len(rest) == 1 and "a" <= rest <= "z":
                out.append(ord(rest) - ord("a") + 1)
            elif rest in _CTRL_SPECIAL:
                out.append(_CTRL_SPECIAL[rest])
            else:
                raise ValueError(f"invalid detach key {key.strip()!r}: ctrl- takes a letter "
                                 "a-z or one of @ [ \\ ] ^ _")
        elif len(key.strip()) == 1 and key.strip().isascii() and key.strip().isprintable():
            out.append(ord(key.strip()))
        else:
            raise ValueError(f"invalid detach key {key!r}: a key is one character or ctrl-X "
                             "(e.g. ctrl-p,ctrl-q)")
    if len(out) > MAX_KEYS:
        raise ValueError(f"a detach sequence has at most {MAX_KEYS} keys")
    return bytes(out)


def detach_keys_option(ctx: Any, param: Any, value: str) -> bytes:
    """The click callback of ``--detach-keys``: the bytes, or a usage error saying why not."""
    import click  # the CLI's; this module stays importable without it

    try:
        return parse_detach_keys(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def describe_keys(keys: bytes) -> str:
    """``Ctrl-P Ctrl-Q`` for the bytes of a detach sequence (for the notices)."""
    names = []
    for byte in keys:
        if 1 <= byte <= 26:
            names.append(f"Ctrl-{chr(byte + ord('A') - 1)}")
        elif byte < 32:
            names.append("Ctrl-" + {v: k for k, v in _CTRL_SPECIAL.items()}[byte])
        else:
            names.append(chr(byte))
    return " ".join(names)


class DetachScanner:
    """Feed it the keys typed; it says what goes to the command and whether to detach."""

    def __init__(self, keys: bytes) -> None:
        self.keys = keys
        self._held = 0  # how many bytes of ``keys`` were typed and held back

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """(the bytes to send on, detach?) -- after a detach the rest of ``data`` is dropped."""
        if not self.keys:
            return data, False
        out = bytearray()
        for byte in data:
            if byte == self.keys[self._held]:
                self._held += 1
                if self._held == len(self.keys):
                    self._held = 0
                    return bytes(out), True
                continue
            if self._held:
                out += self.keys[: self._held]  # not the sequence after all: send as typed
                self._held = 0
                if byte == self.keys[0]:
                    self._held = 1
                    continue
            out.append(byte)
        return bytes(out), False
