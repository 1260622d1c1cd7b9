"""``dsh`` when things go wrong: a daemon that accepts but never answers ``initialize``, calls
that never ran or whose outcome is unknown, dshd dying under ``run`` (a real dshd, killed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket as _socket
import tempfile

import msgspec
import pytest
import trio
from click.testing import CliRunner

from client.api import DaemonUnresponsive, connect, connect_timeout
from client.cli import cli
from client.exits import exit_status
from protocol.lane import ToolResult
from conftest import start_dshd, stop_dshd
from dsh_proc import Live, dsh, dsh_cmd, env_for, ROOT


def status_for(wire: dict):
    """``exit_status`` of a ToolResult given as the wire's JSON (decoded as the client does)."""
    return exit_status(msgspec.convert({"callId": "c", **wire}, ToolResult))


@pytest.fixture
def own_dshd():
    """A real dshd of this test alone (the test kills it)."""
    daemon = start_dshd()
    try:
        yield daemon
    finally:
        stop_dshd(daemon)


@pytest.fixture
async def mute(nursery):
    """A real Unix socket that accepts connections and never reads or answers (like a dshd
    out of file descriptors: the kernel queues the connection, nobody serves it)."""
    d = tempfile.mkdtemp(prefix="dsh-m-", dir="/tmp")
    path = os.path.join(d, "mute.sock")
    sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(16)
    held = []
    scope = trio.CancelScope()

    async def accept_and_hold() -> None:
        with scope:
            while True:
                conn, _ = await sock.accept()
                held.append(conn)

    nursery.start_soon(accept_and_hold)
    yield path
    scope.cancel()
    await trio.sleep(0)
    for conn in held:
        conn.close()
    sock.close()
    shutil.rmtree(d, ignore_errors=True)


def _unanswered(path: str, timeout: str) -> str:
    return (f"dsh: dshd at {path} did not answer initialize within {timeout} s; it may be "
            "overloaded or out of file descriptors (see its log)\n")


# ---------------------------------------------------------------------- initialize timeout
def test_connect_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("DSH_CONNECT_TIMEOUT", raising=False)
    assert connect_timeout() == 10
    for raw, value in (("0.5", 0.5), ("3", 3.0), ("", 10), ("x", 10), ("0", 10), ("-1", 10),
                       ("inf", 10), ("nan", 10)):
        monkeypatch.setenv("DSH_CONNECT_TIMEOUT", raw)
        assert connect_timeout() == value, raw


async def test_connect_gives_up_on_a_daemon_that_never_answers(mute, monkeypatch):
    monkeypatch.setenv("DSH_CONNECT_TIMEOUT", "0.3")
    with trio.fail_after(5):
        with pytest.raises(DaemonUnresponsive) as raised:
            async with connect(mute):
                pass
    assert str(raised.value) == _unanswered(mute, "0.3")[len("dsh: "):-1]


@pytest.mark.parametrize("args", [("status",), ("run", "--", "true"), ("chat", "hello")])
async def test_dsh_says_dshd_did_not_answer_and_exits_2(mute, args):
    start = trio.current_time()
    with trio.fail_after(15):
        proc = await trio.run_process(dsh_cmd(*args), capture_stdout=True, capture_stderr=True,
                                      check=False, cwd=str(ROOT),
                                      env=env_for(mute, DSH_CONNECT_TIMEOUT="0.5"))
    assert trio.current_time() - start < 10
    assert proc.returncode == 2
    assert proc.stderr.decode() == _unanswered(mute, "0.5")
    assert proc.stdout == b""


# ---------------------------------------------------------------------- exit codes
@pytest.mark.parametrize("code", ["STORAGE_FAILURE", "SANDBOX_UNAVAILABLE", "APPROVAL_REJECTED",
                                  "APPROVAL_UNAVAILABLE", "APPROVAL_CANCELLED",
                                  "ABORTED_BEFORE_DISPATCH", "TOOL_NOT_STARTED"])
def test_never_ran_codes_exit_125(code):
    result = {"isError": True, "content": "nothing was started.", "details": {},
              "errorCode": code}
    assert status_for(result) == (125, f"dsh: {code}: nothing was started.")


def test_outcome_unknown_exits_75_with_the_daemons_sentence():
    sentence = ("it may or may not have run; retry only if read-only or idempotent, "
                "otherwise check the outside world first")
    bare = {"isError": True, "content": sentence, "details": {},
            "errorCode": "TOOL_OUTCOME_UNKNOWN"}
    assert status_for(bare) == (75, f"dsh: TOOL_OUTCOME_UNKNOWN: {sentence}")
    with_output = {"isError": True, "errorCode": "TOOL_OUTCOME_UNKNOWN",
                   "content": f"{sentence}\n\nlast output checkpointed before the "
                              "interruption:\npartial\n",
                   "details": {"truncation": {"totalBytes": 8}}}
    assert status_for(with_output) == (75, f"dsh: TOOL_OUTCOME_UNKNOWN: {sentence}")


@pytest.mark.parametrize("command", ["run", "wait"])
def test_help_documents_75_and_125(command):
    text = CliRunner().invoke(cli, [command, "--help"]).output
    assert "75   TOOL_OUTCOME_UNKNOWN" in text
    assert "125  the call did not run" in text and "STORAGE_FAILURE" in text


async def test_wait_for_a_call_dshd_crashed_under_exits_75(own_dshd, tmp_path):
    async with connect(own_dshd.socket) as c:
        sid = await c.create_session(tmp_path)
        cid = await c.run_tool(sid, "echo started; sleep 100")
        with trio.fail_after(20):
            async for view in await c.subscribe(sid):  # until the command runs and printed
                output = view["tools"].get(cid, {}).get("output") or {}
                if "started" in str(output.get("content")):
                    break
    own_dshd.kill9()
    host = json.loads((own_dshd.state_dir / "sessions" / sid / "calls" / cid / "host.json")
                      .read_text())
    os.kill(int(host["pid"]), signal.SIGKILL)  # its call host dies too: the outcome is lost
    own_dshd.start()  # opening the session repairs it: TOOL_OUTCOME_UNKNOWN
    proc = await dsh(own_dshd.socket, "wait", sid, cid)
    assert proc.returncode == 75, proc.stderr
    assert "dsh: TOOL_OUTCOME_UNKNOWN: " in proc.stderr.decode()


async def test_dshd_dying_under_run_says_how_to_learn_the_outcome(own_dshd, tmp_path):
    run = await Live(tmp_path, "run").start(own_dshd.socket, "run", "--call-id", "k3",
                                            "--reconnect-timeout", "1", "--",
                                            "echo started; sleep 100", cwd=tmp_path)
    try:
        await run.until("session ")
        with trio.fail_after(20):
            while "started" not in run.out:
                await trio.sleep(0.02)
        own_dshd.kill9()  # and it stays away: past --reconnect-timeout, the outcome is unknown
        assert await run.wait() == 75
    finally:
        run.kill()
    sid = run.err.split("session ", 1)[1].split()[0]
    last = run.err.splitlines()[-3:]
    assert last[0] == "dsh: lost dshd; reconnecting (up to 1 s)…", run.err
    assert last[1].startswith("dsh: dshd did not come back within 1 s (--reconnect-timeout; "
                              "last attempt: dshd is not running at "), run.err
    assert last[2] == f"dsh: after restarting dshd, `dsh wait {sid} k3` shows what became of the call"
    assert "Traceback" not in run.err
