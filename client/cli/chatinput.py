"""What ``dsh chat`` reads: prompts and approval answers, one line each, and the detach keys.

Theory of operation: stdin is read by one task for the whole command, so a prompt for the
next input and an approval question never race for the same line; ``next(prompt)`` gives the
next line (None at end of file).

* Off a terminal, :class:`Lines` reads lines as they come (``sys.stdin.readline``).
* On a terminal, :class:`TtyLines` puts it in a key-at-a-time mode for the whole chat
  (``ICANON``, ``ECHO`` and ``IXON`` off, so ``Ctrl-Q`` reaches us; ``ISIG`` stays on, so
  ``Ctrl-C`` is still SIGINT) and restores it on the way out. Every key goes through a
  ``client.cli.keys.DetachScanner`` with ``dsh attach``'s detach sequence (``Ctrl-P Ctrl-Q``
  unless ``--detach-keys`` says otherwise): the whole sequence sets :attr:`TtyLines.detach`
  and never reaches a line; other keys edit the line, echoed on stderr (Backspace, ``Ctrl-U``
  clears it, Enter ends it, ``Ctrl-D`` on an empty line is end of file).
"""

from __future__ import annotations

import codecs
import os
import sys
import termios

import anyio

from client.cli.keys import DetachScanner
from protocol.printable import printable

__all__ = ["Lines", "TtyLines"]

#: Most characters of one line typed at a terminal (more are not taken).
MAX_LINE = 65536


class Lines:
    """stdin, one line at a time, read by a single task (``run``); None at end of file."""

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[str | None](0)
        self.detach = anyio.Event()  # never set off a terminal

    async def run(self) -> None:
        async with self._send:  # closed at end of file: every later next() is None
            while True:
                line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                if not line:
                    return
                await self._send.send(line.rstrip("\n"))

    async def next(self, prompt: str = "") -> str | None:
        if prompt:
            sys.stderr.write(printable(prompt, keep="\n\t"))
            sys.stderr.flush()
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None


class TtyLines(Lines):
    """A terminal's keys: lines edited here, and the detach sequence (module doc)."""

    def __init__(self, detach_keys: bytes, fd: int = 0) -> None:
        super().__init__()
        self.fd = fd
        self.scanner = DetachScanner(detach_keys)
        self._saved: list | None = None
        self._line: list[str] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __enter__(self) -> "TtyLines":
        self._saved = termios.tcgetattr(self.fd)
        mode = termios.tcgetattr(self.fd)
        mode[0] &= ~termios.IXON
        mode[3] &= ~(termios.ICANON | termios.ECHO)
        mode[6][termios.VMIN], mode[6][termios.VTIME] = 1, 0
        termios.tcsetattr(self.fd, termios.TCSADRAIN, mode)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    async def run(self) -> None:
        async with self._send:
            while True:
                data = await anyio.to_thread.run_sync(os.read, self.fd, 1024,
                                                      abandon_on_cancel=True)
                if not data:
                    return
                keys, detach = self.scanner.feed(data)
                for line in self._edit(self._decoder.decode(keys)):
                    if line is None:
                        return
                    await self._send.send(line)
                if detach:
                    self.detach.set()

    def _edit(self, text: str) -> list[str | None]:
        """Apply typed characters to the line; the lines they ended (None: end of file)."""
        done: list[str | None] = []
        for ch in text:
            if ch in "\r\n":
                done.append("".join(self._line))
                self._line.clear()
                _echo("\n")
            elif ch in "\x7f\b":
                if self._line:
                    self._line.pop()
                    _echo("\b \b")
            elif ch == "\x15":  # Ctrl-U
                _echo("\b \b" * len(self._line))
                self._line.clear()
            elif ch == "\x04":  # Ctrl-D
                if not self._line:
                    _echo("\n")
                    done.append(None)
                    return done
            elif ch.isprintable() and len(self._line) < MAX_LINE:
                self._line.append(ch)
                _echo(ch)
        return done


def _echo(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()
