"""run_hosted: real call hosts, real subprocesses, real logs (EXEC.md §2, HOST.md §2-§5).

No assertion is about elapsed time: kill paths are checked by their outcome (flags, 128+signal
exit codes) and by the state of pids the command printed.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import stat
import subprocess
from pathlib import Path

import pytest
import trio

import json
import tempfile

from dshd.execution.capture import OutputCapture, ShellOutputLimits
from dshd.execution.hosted import ExecOutcome, run_hosted
from dshd.execution.spawn import bash_argv

from .helpers import alive, wait_dead

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}


def new_call_dir() -> Path:
    """A fresh call dir (0700), as the session makes ``calls/<callId>/``."""
    return Path(tempfile.mkdtemp(prefix="dsh-call-"))


async def run_command(argv: list[str], *, call_dir: Path | None = None, **kwargs) -> ExecOutcome:
    """``run_hosted`` in a fresh call dir (the host path every call takes)."""
    return await run_hosted(argv, call_dir=call_dir or new_call_dir(), **kwargs)


class Recorder:
    """on_output callback: counts calls, tracks peak buffer sizes, wakes waiters."""

    def __init__(self, capture: OutputCapture) -> None:
        self.capture = capture
        self.calls = 0
        self.peak: dict[str, int] = {}
        self.changed = trio.Event()

    def __call__(self) -> None:
        self.calls += 1
        for key, value in self.capture.statistics().items():
            self.peak[key] = max(self.peak.get(key, 0), value)
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, pattern: str) -> re.Match[str]:
        while (match := re.search(pattern, self.capture.text)) is None:
            await self.changed.wait()
        return match


async def run(
    command: str,
    cwd: Path,
    *,
    call_dir: Path | None = None,
    timeout: float | None = None,
    cancel: trio.Event | None = None,
    recorder: Recorder | None = None,
    **kwargs: float,
) -> tuple[ExecOutcome, OutputCapture, Recorder]:
    """Run ``command`` to the end; pass ``recorder`` to watch its output while it runs."""
    if recorder is None:
        recorder = Recorder(OutputCapture(ShellOutputLimits(), (call_dir or Path("/x")) / "output.raw"))
    capture = recorder.capture
    outcome = await run_command(
        bash_argv(command),
        call_dir=call_dir,
        cwd=str(cwd),
        env=ENV,
        capture=capture,
        on_output=recorder,
        timeout=timeout,
        cancel=cancel if cancel is not None else trio.Event(),
        **kwargs,
    )
    return outcome, capture, recorder


def pids(text: str) -> list[int]:
    return [int(p) for p in re.findall(r"pid=(\d+)", text)]


# -- output ----------------------------------------------------------------------------------


async def test_20_mb_of_yes_keeps_a_window_and_spills_everything(session_dir: Path) -> None:
    command = "yes | head -c 20000000"
    expected = hashlib.sha256(subprocess.run(["bash", "-c", command], capture_output=True, check=True).stdout)
    call_dir = new_call_dir()
    outcome, capture, recorder = await run(command, session_dir, call_dir=call_dir)

    assert outcome == ExecOutcome(exit_code=0)
    assert len(capture.text.encode()) <= 51_200
    assert capture.text == "y\n" * 2000
    assert capture.truncation == {
        "truncated": True,
        "truncatedBy": "lines",
        "totalBytes": 20_000_000,
        "totalLines": 10_000_000,
        "maxBytes": 51_200,
        "maxLines": 2_000,
    }
    spill = Path(capture.spill_path)
    assert spill == call_dir / "output.raw"
    assert spill.stat().st_size == 20_000_000
    assert stat.S_IMODE(spill.stat().st_mode) == 0o600
    digest = hashlib.sha256()
    with spill.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    assert digest.hexdigest() == expected.hexdigest()
    # O(window) memory: checked on the capture's own buffers after every read.
    assert recorder.calls > 1
    assert recorder.peak["windowChars"] <= 51_200
    assert recorder.peak["decoderPending"] <= 3
    record = json.loads((call_dir / "exit.json").read_text())
    assert record["reason"] == "exited" and record["totalBytes"] == 20_000_000


async def test_stdout_and_stderr_merge_in_order_and_stdin_is_empty(tmp_path: Path) -> None:
    outcome, capture, _ = await run("echo a; echo b >&2; echo c; cat; echo d >&2", tmp_path)
    assert outcome.exit_code == 0
    assert capture.text == "a\nb\nc\nd\n"


async def test_cwd_and_env_are_used(tmp_path: Path) -> None:
    capture = OutputCapture(ShellOutputLimits(), None)
    outcome = await run_command(
        bash_argv('pwd; echo "$DSH_CALL_ID"'),
        cwd=str(tmp_path),
        env={**ENV, "DSH_CALL_ID": "call-7"},
        capture=capture,
        on_output=lambda: None,
        timeout=None,
        cancel=trio.Event(),
    )
    assert outcome.exit_code == 0
    assert capture.text == f"{tmp_path}\ncall-7\n"
    assert capture.finished


async def test_a_command_starting_with_a_dash_is_not_a_shell_option(tmp_path: Path) -> None:
    outcome, capture, _ = await run("-x", tmp_path)
    assert outcome.exit_code == 127  # "command not found", not bash's -x option


# -- exit codes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "code"),
    [("true", 0), ("false", 1), ("sh -c 'exit 3'", 3), ("kill -TERM $$", 143), ("kill -KILL $$", 137)],
)
async def test_exit_codes(tmp_path: Path, command: str, code: int) -> None:
    outcome, _, _ = await run(command, tmp_path)
    assert outcome == ExecOutcome(exit_code=code)


async def test_spawn_failures_are_sentences(tmp_path: Path) -> None:
    capture = OutputCapture(ShellOutputLimits(), None)
    calls = []
    outcome = await run_command(
        [str(tmp_path / "no-such-program")],
        cwd=str(tmp_path),
        env=ENV,
        capture=capture,
        on_output=lambda: calls.append(1),
        timeout=None,
        cancel=trio.Event(),
    )
    assert outcome.exit_code is None
    assert "no-such-program" in outcome.error and "Could not start" in outcome.error
    assert capture.finished and calls

    outcome = await run_command(
        ["true"],
        cwd=str(tmp_path / "missing-dir"),
        env=ENV,
        capture=OutputCapture(ShellOutputLimits(), None),
        on_output=lambda: None,
        timeout=None,
        cancel=trio.Event(),
    )
    assert outcome.exit_code is None
    assert "working directory" in outcome.error


# -- stopping ---------------------------------------------------------------------------------


async def test_timeout_kills_the_command_and_its_children(tmp_path: Path) -> None:
    outcome, capture, _ = await run("sleep 100 & echo pid=$!; echo pid=$$; sleep 100", tmp_path, timeout=1)
    assert outcome.timed_out and not outcome.cancelled and outcome.error is None
    assert outcome.exit_code == 128 + signal.SIGTERM
    child, leader = pids(capture.text)
    assert await wait_dead(child)
    assert not alive(leader)


async def _run_then_cancel(command: str, tmp_path: Path, pattern: str, *, before=None,
                           **kwargs):
    """Run ``command``; once its output matches ``pattern`` (and ``before(match)`` returned),
    set the cancel event. ``(outcome, match)``."""
    cancel = trio.Event()
    recorder = Recorder(OutputCapture(ShellOutputLimits(), None))
    result: list[ExecOutcome] = []

    async def go() -> None:
        outcome, _, _ = await run(command, tmp_path, cancel=cancel, recorder=recorder, **kwargs)
        result.append(outcome)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(go)
        match = await recorder.wait_for(pattern)
        if before is not None:
            await before(match)
        cancel.set()
    [outcome] = result
    return outcome, match


async def test_cancel_event_kills_the_command_and_its_children(tmp_path: Path) -> None:
    outcome, match = await _run_then_cancel("sleep 100 & echo pid=$!; sleep 100", tmp_path,
                                            r"pid=(\d+)")
    assert outcome.cancelled and not outcome.timed_out
    assert outcome.exit_code == 128 + signal.SIGTERM
    assert await wait_dead(int(match.group(1)))


async def test_sigterm_ignored_is_followed_by_sigkill(tmp_path: Path) -> None:
    outcome, capture, _ = await run(
        "trap '' TERM; sleep 100 & echo pid=$!; sleep 100", tmp_path, timeout=0.5, kill_grace=0.5
    )
    assert outcome.timed_out
    assert outcome.exit_code == 128 + signal.SIGKILL
    [child] = pids(capture.text)
    assert await wait_dead(child)


async def test_background_child_holding_the_pipe_is_killed_after_eof_grace(tmp_path: Path) -> None:
    outcome, capture, _ = await run("sleep 100 & echo pid=$!; echo done", tmp_path, eof_grace=0.5)
    assert outcome == ExecOutcome(exit_code=0)
    assert capture.text.endswith("done\n")
    [child] = pids(capture.text)
    assert await wait_dead(child)


async def test_background_child_that_closed_the_pipe_is_ended_too(tmp_path: Path) -> None:
    # The host ends the remaining tree after the command (plan §C): no orphan survives.
    outcome, capture, _ = await run("sleep 100 >/dev/null 2>&1 & echo pid=$!", tmp_path,
                                    eof_grace=0.5)
    [child] = pids(capture.text)
    try:
        assert outcome == ExecOutcome(exit_code=0)
        assert await wait_dead(child)
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


async def test_holder_outside_the_group_does_not_keep_the_call_open(tmp_path: Path) -> None:
    # setsid leaves the process group; the host (subreaper, token sweep) still ends it.
    outcome, capture, _ = await run(
        "setsid sleep 100 & echo pid=$!", tmp_path, eof_grace=0.2, kill_grace=0.2
    )
    [child] = pids(capture.text)
    try:
        assert outcome == ExecOutcome(exit_code=0)
        assert capture.finished
        assert await wait_dead(child)
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


async def test_outside_cancellation_kills_the_group_before_propagating(tmp_path: Path) -> None:
    capture = OutputCapture(ShellOutputLimits(), None)
    recorder = Recorder(capture)
    finished = []

    async def go(scope_box: list[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            scope_box.append(scope)
            await run_command(
                bash_argv("sleep 100 & echo pid=$!; echo pid=$$; sleep 100"),
                cwd=str(tmp_path),
                env=ENV,
                capture=capture,
                on_output=recorder,
                timeout=None,
                cancel=trio.Event(),
            )
            finished.append("returned")  # must not happen: the cancellation propagates
        finished.append("cancelled")

    box: list[trio.CancelScope] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(go, box)
        await recorder.wait_for(r"pid=\d+\npid=\d+")
        box[0].cancel()
    assert finished == ["cancelled"]
    child, leader = pids(capture.text)
    # The host was told to kill the tree inside the shielded cleanup, before the
    # cancellation propagates.
    assert await wait_dead(leader)
    assert await wait_dead(child)
    assert capture.finished


async def test_invalid_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        await run("true", tmp_path, timeout=-1)
    with pytest.raises(ValueError):
        await run("true", tmp_path, kill_grace=float("nan"))


async def test_a_failing_on_output_still_kills_the_group(tmp_path: Path) -> None:
    capture = OutputCapture(ShellOutputLimits(), None)

    def on_output() -> None:
        if "pid=" in capture.text and not capture.finished:
            raise RuntimeError("publisher bug")

    # A bug in a task of run_hosted's nursery comes out as a (strict) exception group.
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="publisher bug"), flatten_subgroups=True):
        await run_command(
            bash_argv("echo pid=$$; exec sleep 100"),
            cwd=str(tmp_path),
            env=ENV,
            capture=capture,
            on_output=on_output,
            timeout=None,
            cancel=trio.Event(),
        )
    [leader] = pids(capture.text)
    assert await wait_dead(leader)


async def test_cancel_during_eof_grace_kills_the_holder_at_once(tmp_path: Path) -> None:
    async def leader_exited(match) -> None:
        assert await wait_dead(int(match.group(2)))  # exited (a zombie until reaped)

    outcome, match = await _run_then_cancel(
        "sleep 100 & echo pid=$!; echo leader=$$", tmp_path, r"pid=(\d+)\nleader=(\d+)\n",
        before=leader_exited, eof_grace=1000)  # only the cancel can end the wait
    assert outcome == ExecOutcome(exit_code=0)  # the command itself had finished
    assert await wait_dead(int(match.group(1)))
