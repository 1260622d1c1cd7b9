"""Pieces of the interactive approval answerer (``dsh attach --approve``, PROTOCOL.md §3.4).

Theory of operation: ``LineReader`` reads stdin in a worker thread with ``os.read`` on the file
descriptor -- never through ``sys.stdin``, whose buffered reader an abandoned thread would hold
locked at interpreter shutdown -- and queues each line with the time it arrived
(``anyio.current_time``) in a bounded channel (``LINE_BOUND`` lines: past that it stops
reading until the answerer takes one); EOF is sticky. ``line(since)`` takes the next line. On a terminal a line that arrived before
``since`` (the moment a prompt was shown) is dropped: an answer typed for a request that was
decided elsewhere meanwhile must never approve the next one. From a pipe every line counts, in
order (``printf 'y\\nn\\n' | dsh attach --approve S`` answers the first two requests).

``request_lines`` renders a request for a person: the tool, the call, the sandbox the call
would run in, then the exact full command (``summary``), never truncated, each line indented,
with every character that is not printable other than newline and tab shown as a visible
escape (``protocol.printable.printable``: a carriage return or an escape sequence must not hide
part of what is approved). ``parse_answer`` reads y/n.
``Outcomes`` finds how an approval was decided from the session's log (``approval/decided``
events after a known seq), for a request that left the lane while we were not deciding it.
"""

from __future__ import annotations

import os
from typing import Any

import anyio

from client.api import Client
from protocol.printable import printable
from protocol.events import ApprovalDecided
from protocol.methods import SandboxInfo

__all__ = ["LineReader", "request_lines", "parse_answer", "visible", "Outcomes",
           "sandbox_label"]

_READ_SIZE = 4096
#: Lines read ahead of the answerer (more are left in the pipe until it takes one).
LINE_BOUND = 256


class LineReader:
    """Lines of a file descriptor, read in a thread; run ``run`` in a nursery."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        try:
            self.tty = os.isatty(fd)
        except OSError:
            self.tty = False
        self._send, self._receive = anyio.create_memory_object_stream[
            tuple[float, "str | None"]](LINE_BOUND)
        self.eof = False

    async def run(self) -> None:
        buf = b""
        while True:
            try:
                chunk = await anyio.to_thread.run_sync(os.read, self.fd, _READ_SIZE,
                                                       abandon_on_cancel=True)
            except OSError:
                chunk = b""
            now = anyio.current_time()
            if not chunk:
                if buf:
                    await self._send.send((now, buf.decode("utf-8", "replace")))
                await self._send.send((now, None))
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                await self._send.send((now, line.decode("utf-8", "replace").rstrip("\r")))

    async def line(self, since: float | None = None) -> str | None:
        """The next line (None at EOF). On a terminal, lines that came before ``since`` are
        type-ahead for something else: dropped."""
        while not self.eof:
            at, line = await self._receive.receive()
            if line is None:
                self.eof = True
                break
            if self.tty and since is not None and at < since:
                continue
            return line
        return None


def parse_answer(line: str) -> str | None:
    """``allow`` | ``reject`` for a y/n answer, None for anything else."""
    word = line.strip().lower()
    if word in ("y", "yes"):
        return "allow"
    if word in ("n", "no"):
        return "reject"
    return None


def visible(text: str) -> str:
    """``text`` with every non-printable character but newline and tab shown as an escape
    (``\\x1b``, ``\\u2028``; ``protocol.printable.printable``)."""
    return printable(text, keep="\n\t")


def sandbox_label(mode: Any, provider: SandboxInfo | None) -> str:
    """Where the call would run: the session's sandbox mode and how far the daemon confines
    (``provider``: the ``sandbox`` of the ``initialize`` answer)."""
    mode = mode if isinstance(mode, str) else "?"
    if mode == "danger-full-access":
        return "sandbox danger-full-access (not confined)"
    name = provider.provider if provider is not None else None
    completeness = provider.completeness if provider is not None else None
    if not name:
        return f"sandbox {mode}"
    if completeness == "none" or name == "none":
        return f"sandbox {mode} (provider {name}: NOT confined)"
    if completeness and completeness != "full":
        return f"sandbox {mode} (provider {name}, {completeness})"
    return f"sandbox {mode} (provider {name})"


def request_lines(session_id: str, approval_id: str, request: dict[str, Any], mode: Any,
                  provider: SandboxInfo | None) -> list[str]:
    """The lines that show one pending request (see module doc)."""
    tool = request.get("tool", "?")
    summary = request.get("summary")
    summary = summary if isinstance(summary, str) else str(summary)
    shown = visible(summary)
    lines = [printable(f"── approval {approval_id}: call {request.get('callId', '?')} in session "
                       f"{session_id} asks to run {tool}, {sandbox_label(mode, provider)}:")]
    lines += ["    " + line for line in (shown.split("\n") if shown else ["(empty)"])]
    if shown != summary:
        lines.append("    (control characters are shown escaped, as \\xNN)")
    return lines


class Outcomes:
    """How approvals were decided, from ``approval/decided`` events after ``after_seq``."""

    def __init__(self, client: Client, session_id: str, after_seq: int) -> None:
        self.client = client
        self.session_id = session_id
        self.after_seq = after_seq
        self.known: dict[str, str] = {}

    async def lookup(self, approval_id: str) -> str | None:
        if approval_id not in self.known:
            async for event in self.client.iter_events(self.session_id, self.after_seq):
                self.after_seq = max(self.after_seq, event.seq)
                if isinstance(event, ApprovalDecided):
                    self.known[event.data.approval_id] = event.data.outcome
        return self.known.get(approval_id)
