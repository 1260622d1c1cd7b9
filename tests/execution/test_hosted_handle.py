"""The per-call HostHandle through a real call host: stdin, terminal, resize, signals, and a
host that dies (HOST.md §4-§5, plan §D)."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
from pathlib import Path

import pytest
import trio

from dshd.execution.capture import OutputCapture, ShellOutputLimits
from dshd.execution.hosted import ExecOutcome, HostHandle, HostRequestError, run_hosted
from dshd.execution.spawn import bash_argv

from .helpers import wait_dead

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}


class Live:
    """A run_hosted in the background: its handle, its capture, its outcome."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dsh-call-"))
        self.capture = OutputCapture(ShellOutputLimits(), self.dir / "output.raw")
        self.handle: HostHandle | None = None
        self.outcome: ExecOutcome | None = None
        self.changed = trio.Event()
        self.got_handle = trio.Event()
        self.cancel = trio.Event()

    def on_output(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def on_host(self, handle: HostHandle) -> None:
        self.handle = handle
        self.got_handle.set()

    async def run(self, command: str, **kwargs) -> None:
        self.outcome = await run_hosted(
            bash_argv(command), call_dir=self.dir, cwd="/", env=ENV, capture=self.capture,
            on_output=self.on_output, timeout=kwargs.pop("timeout", 60), cancel=self.cancel,
            on_host=self.on_host, **kwargs)
        self.on_output()

    async def wait_for(self, pattern: str) -> re.Match[str]:
        with trio.fail_after(20):
            while (m := re.search(pattern, self.capture.text)) is None:
                await self.changed.wait()
        return m


async def start(nursery: trio.Nursery, command: str, **kwargs) -> Live:
    live = Live()
    nursery.start_soon(lambda: live.run(command, **kwargs))
    with trio.fail_after(20):
        await live.got_handle.wait()
    return live


async def test_stdin_pipe_is_written_and_closed() -> None:
    async with trio.open_nursery() as nursery:
        live = await start(nursery, "read line; echo got=$line; cat; echo end", stdin="pipe")
        assert live.handle.stdin_pipe and not live.handle.tty
        assert await live.handle.write(b"hello\n") == 6
        await live.wait_for(r"got=hello\n")
        await live.handle.write(b"more\n")
        await live.handle.close_stdin()
    assert live.outcome == ExecOutcome(exit_code=0)
    assert live.capture.text == "got=hello\nmore\nend\n"
    # After the end: the handle keeps the record and refuses requests with not-running.
    assert live.handle.record is not None and live.handle.record["reason"] == "exited"
    with pytest.raises(HostRequestError) as info:
        await live.handle.write(b"late")
    assert info.value.code == "not-running"


async def test_a_call_without_stdin_pipe_refuses_writes_with_no_stdin() -> None:
    async with trio.open_nursery() as nursery:
        live = await start(nursery, "sleep 1; cat; echo eof=$?")  # alive at the write
        with pytest.raises(HostRequestError) as info:
            await live.handle.write(b"x")
        assert info.value.code == "no-stdin" and info.value.sentence
    assert live.capture.text == "eof=0\n"  # stdin was /dev/null: cat ended at once


async def test_tty_call_has_a_terminal_of_the_size_asked_and_resizes() -> None:
    async with trio.open_nursery() as nursery:
        live = await start(
            nursery, "test -t 0 && echo interactive; stty size; echo TERM=$TERM; read x; "
                     "stty size", tty=(100, 30, "xterm-256color"))
        assert live.handle.tty
        await live.wait_for(r"30 100\r?\n")
        await live.handle.resize(120, 40)
        await live.handle.write(b"\n")
        await live.wait_for(r"40 120")
    assert live.outcome == ExecOutcome(exit_code=0)
    assert "interactive" in live.capture.text and "TERM=xterm-256color" in live.capture.text


async def test_signal_reaches_a_trap() -> None:
    async with trio.open_nursery() as nursery:
        live = await start(nursery, "trap 'echo got INT; exit 5' INT; echo ready; "
                                    "while :; do sleep 0.1; done")
        await live.wait_for("ready")
        await live.handle.signal("INT")
    assert live.outcome == ExecOutcome(exit_code=5)
    assert "got INT" in live.capture.text


async def test_wait_progress_returns_once_the_log_grew() -> None:
    async with trio.open_nursery() as nursery:
        live = await start(nursery, "read x; echo abc", stdin="pipe")
        end = live.handle.end_offset
        with trio.move_on_after(0.3) as idle:
            await live.handle.wait_progress(end)
        assert idle.cancelled_caught  # nothing new yet
        await live.handle.write(b"\n")
        with trio.fail_after(20):
            await live.handle.wait_progress(end)
        assert live.handle.end_offset > end or live.handle.record is not None


async def test_a_host_that_dies_is_an_error_outcome() -> None:
    async with trio.open_nursery() as nursery:
        live = await start(nursery, "echo pid=$$; sleep 100")
        m = await live.wait_for(r"pid=(\d+)")
        host = json.loads((live.dir / "host.json").read_text())["pid"]
        os.kill(host, signal.SIGKILL)
    assert live.outcome.exit_code is None
    assert f"the call host (pid {host}) died" in live.outcome.error
    assert live.capture.finished and live.capture.text.startswith("pid=")
    try:  # the host's command, orphaned by the kill (when bwrap's pdeathsig did not end it)
        os.kill(int(m.group(1)), signal.SIGKILL)
    except ProcessLookupError:
        pass
    assert await wait_dead(int(m.group(1)))
