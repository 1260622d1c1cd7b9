"""A call host that stops answering (SIGSTOP, or one that ignores ``attach`` and ``terminate``)
is SIGKILLed with its command when a cancel, a timeout or an outside cancellation asks it to
end the command and no exit record comes within the kill grace and a bound (HOST.md §4).

Real hosts, real signals. The bounds below are liveness bounds, never speed targets.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import trio

from dshd.callhost import tree
from dshd.execution.capture import OutputCapture, ShellOutputLimits
from dshd.execution.hosted import adopt_hosted

from .helpers import alive, wait_dead
from .test_hosted_handle import start

#: Liveness bound: kill grace + the escalation bound (10 s) + a generous margin.
LIVENESS = 60


def _kill(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def _stopped_host(nursery, **kwargs):
    live = await start(nursery, "echo pid=$$; while :; do echo tick; sleep 0.1; done", **kwargs)
    command = int((await live.wait_for(r"pid=(\d+)")).group(1))
    host = json.loads((live.dir / "host.json").read_text())["pid"]
    os.kill(host, signal.SIGSTOP)
    return live, host, command


async def test_a_cancel_of_a_stopped_host_kills_it_and_settles_cancelled() -> None:
    host = command = 0
    try:
        with trio.fail_after(LIVENESS):
            async with trio.open_nursery() as nursery:
                live, host, command = await _stopped_host(nursery, kill_grace=0.5, timeout=None)
                live.cancel.set()
        outcome = live.outcome
        assert outcome.cancelled and outcome.exit_code is None, outcome
        assert f"the call host (pid {host}) did not answer" in outcome.error, outcome.error
        assert "killed" in outcome.error, outcome.error
        assert await wait_dead(host) and await wait_dead(command)
        assert live.capture.finished and "tick\n" in live.capture.text
    finally:
        _kill(host, command)


async def test_a_timeout_of_a_stopped_host_kills_it_and_settles_timed_out() -> None:
    host = command = 0
    try:
        with trio.fail_after(LIVENESS):
            async with trio.open_nursery() as nursery:
                live, host, command = await _stopped_host(nursery, kill_grace=0.5, timeout=1)
        outcome = live.outcome
        assert outcome.timed_out and outcome.exit_code is None, outcome
        assert f"the call host (pid {host}) did not answer" in outcome.error, outcome.error
        assert await wait_dead(host) and await wait_dead(command)
    finally:
        _kill(host, command)


async def test_an_outside_cancellation_of_a_stopped_host_kills_it() -> None:
    host = command = 0
    cancelled = False
    try:
        with trio.fail_after(LIVENESS):
            async with trio.open_nursery() as nursery:
                live, host, command = await _stopped_host(nursery, kill_grace=0.5, timeout=None)
                nursery.cancel_scope.cancel()
            cancelled = True
        assert cancelled and live.outcome is None
        assert await wait_dead(host) and await wait_dead(command)
    finally:
        _kill(host, command)


#: A "host" that says hello and then ignores every request (attach, terminate): what an
#: attacker's or a wedged host looks like to the daemon.
DEAF_HOST = r"""
import os, socket, sys
directory = sys.argv[1]
fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(f"/proc/self/fd/{fd}/control.sock")
listener.listen(8)
print("listening", flush=True)
conns = []
while True:
    conn, _ = listener.accept()
    conns.append(conn)
    conn.recv(65536)
    conn.sendall(b'{"hello": 1, "version": 1, "pid": %d}\n' % os.getpid())
"""


async def test_a_host_that_ignores_attach_and_terminate_is_killed_at_a_cancel() -> None:
    directory = Path(tempfile.mkdtemp(prefix="dsh-call-"))
    deaf = subprocess.Popen([sys.executable, "-c", DEAF_HOST, str(directory)],
                            stdout=subprocess.PIPE)
    try:
        assert deaf.stdout.readline() == b"listening\n"
        record = {"pid": deaf.pid, "startTime": tree.proc_stat(deaf.pid).start_time,
                  "control": "control.sock", "secret": "s", "token": secrets.token_hex(16),
                  "tokenVar": "DSH_RUN", "segmentBytes": 4096, "commandPid": None}
        capture = OutputCapture(ShellOutputLimits(), directory / "output.raw")
        cancel = trio.Event()
        box = []

        async def adopt() -> None:
            box.append(await adopt_hosted(directory, record, capture=capture,
                                          on_output=lambda: None, cancel=cancel,
                                          kill_grace=0.5))

        with trio.fail_after(LIVENESS):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(adopt)
                await trio.sleep(0.5)
                cancel.set()
        outcome = box[0]
        assert outcome.cancelled and outcome.exit_code is None, outcome
        assert f"the call host (pid {deaf.pid}) did not answer" in outcome.error, outcome.error
        with trio.fail_after(LIVENESS):
            while deaf.poll() is None:
                await trio.sleep(0.02)
        assert deaf.returncode == -signal.SIGKILL
    finally:
        _kill(deaf.pid)
        deaf.wait()
