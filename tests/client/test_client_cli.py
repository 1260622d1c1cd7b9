"""The ``dsh`` CLI: pure helpers, errors in-process, whole commands in a subprocess against a
real dshd, and -- against the fake peer -- the few answers a real dshd cannot be made to give
(a call that settled between two lane flushes, an unreadable spill path, a damaged session's
long reason). tests/e2e/test_e2e_cli.py covers more of the CLI against a real dshd."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import msgspec
import pytest
import trio
from click.testing import CliRunner

from client.api import connect

from client.cli import cli
from client.cli.run import command_string
from client.exits import exit_status
from protocol.lane import ToolResult
from dsh_proc import Live, dsh, dsh_cmd, env_for
from fake_dshd import FakeDshd, FakeError, settle_ops, tool_entry


def status_for(wire: dict):
    """``exit_status`` of a ToolResult given as the wire's JSON (decoded as the client does)."""
    return exit_status(msgspec.convert({"callId": "c", **wire}, ToolResult))


# ---------------------------------------------------------------------- pure helpers
def test_command_string_single_argument_is_passed_as_is():
    assert command_string(("make -j2 | tee x",)) == "make -j2 | tee x"
    assert command_string(("echo", "a b", "$HOME")) == "echo 'a b' '$HOME'"


@pytest.mark.parametrize(
    "result, expected",
    [
        ({"isError": False, "content": "", "details": {"exitCode": 0}, "exitCode": 0}, 0),
        ({"isError": True, "content": "", "details": {"exitCode": 3}}, 3),
        ({"isError": True, "content": "", "details": {"exitCode": 143}, "exitCode": 143,
          "errorCode": "TOOL_TIMEOUT"}, 124),
        ({"isError": True, "content": "The sandbox is unavailable: install bwrap.",
          "details": {}, "errorCode": "SANDBOX_UNAVAILABLE"}, 125),
        ({"isError": True, "content": "", "details": {}}, 1),
    ],
)
def test_exit_status(result, expected):
    code, message = status_for(result)
    assert code == expected
    if expected == 125:
        assert message == "dsh: SANDBOX_UNAVAILABLE: The sandbox is unavailable: install bwrap."


def test_exit_status_sentence_comes_from_message_when_content_is_output():
    cancelled = {"isError": True, "content": "partial output\n", "errorCode": "TOOL_CANCELLED",
                 "message": "cancelled; the process group was killed",
                 "details": {"truncation": {"totalBytes": 15}, "exitCode": 143}, "exitCode": 143}
    assert status_for(cancelled) == (143, "dsh: TOOL_CANCELLED: cancelled; the process group was killed")
    failed = {"isError": True, "content": "output\n", "errorCode": "TOOL_FAILED",
              "details": {"truncation": {"totalBytes": 7}}}
    assert status_for(failed) == (125, "dsh: TOOL_FAILED")  # the output is not the sentence


# ---------------------------------------------------------------------- in-process errors
def test_daemon_not_running_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "no.sock"
    result = CliRunner().invoke(cli, ["--socket", str(missing), "status"])
    assert result.exit_code == 2
    assert result.stderr == (f"dshd is not running at {missing}; start it with `dshd` "
                             "(or `systemctl --user start dshd`)\n")
    assert result.stdout == ""


def test_socket_comes_from_the_environment(tmp_path):
    missing = tmp_path / "env.sock"
    result = CliRunner().invoke(cli, ["sessions"], env={"DSH_SOCKET": str(missing)})
    assert result.exit_code == 2 and str(missing) in result.stderr


def test_bad_call_id_is_refused_before_connecting(tmp_path):
    result = CliRunner().invoke(cli, ["--socket", str(tmp_path / "x"), "run", "--call-id",
                                      "__proto__", "--", "true"])
    assert result.exit_code == 2 and "--call-id" in result.stderr


# ---------------------------------------------------------------------- subprocess + real dshd
@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="dsh-w-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _session(daemon, workdir: Path) -> str:
    async with connect(daemon.socket) as c:
        return await c.create_session(workdir)


async def _tool_calls(daemon, sid: str) -> list[dict]:
    async with connect(daemon.socket) as c:
        return [json.loads(e["data"]["arguments"]) async for e in c.iter_events(sid)
                if e["type"] == "tool/call"]


async def test_run_prints_the_output_once_and_exits_with_the_exit_code(real_dshd, workdir):
    command = "printf 'one\\n'; sleep 0.2; printf 'two\\n'; exit 3"
    proc = await dsh(real_dshd.socket, "run", "--call-id", "k1", "--timeout", "9", "--",
                     command, cwd=workdir)
    assert proc.stdout == b"one\ntwo\n"
    assert proc.returncode == 3, proc.stderr
    first = proc.stderr.decode().splitlines()[0]
    assert first.startswith("session ") and first.endswith(" call k1")
    sid = first.split()[1]
    async with connect(real_dshd.socket) as c:
        info = await c.get_session(sid)
    assert (info["title"], info["cwd"]) == (command, str(workdir))
    # stdin is a pipe here (not a terminal): the call takes it (``stdin: "pipe"``).
    assert await _tool_calls(real_dshd, sid) == [{"command": command, "timeout": 9.0,
                                                  "stdin": "pipe"}]


async def test_run_in_an_existing_session_joins_argv(real_dshd, workdir):
    sid = await _session(real_dshd, workdir)
    proc = await dsh(real_dshd.socket, "run", "--session", sid, "--", "echo", "a  b", "$HOME")
    assert (proc.returncode, proc.stdout) == (0, b"a  b $HOME\n"), proc.stderr
    assert await _tool_calls(real_dshd, sid) == [{"command": "echo 'a  b' '$HOME'",
                                                  "stdin": "pipe"}]


@pytest.mark.parametrize("args, command", [
    (["--", "echo", "-la"], "echo -la"),
    (["echo", "-la"], "echo -la"),
    (["--timeout", "5", "sh", "-c", "echo --json"], "sh -c 'echo --json'"),
    (["--", "--weird-name", "--json"], "--weird-name --json"),
])
async def test_run_takes_everything_after_the_options_as_the_command(real_dshd, workdir, args,
                                                                     command):
    sid = await _session(real_dshd, workdir)
    await dsh(real_dshd.socket, "run", "--session", sid, *args)
    assert [c["command"] for c in await _tool_calls(real_dshd, sid)] == [command]


async def test_reused_call_id_says_nothing_ran_again(real_dshd, workdir):
    sid = await _session(real_dshd, workdir)
    first = await dsh(real_dshd.socket, "run", "--session", sid, "--call-id", "k1", "--",
                      "echo old output")
    assert "already exists" not in first.stderr.decode()
    proc = await dsh(real_dshd.socket, "run", "--session", sid, "--call-id", "k1", "--",
                     "echo old output")
    assert proc.returncode == 0, proc.stderr
    assert (f"dsh: call k1 already exists in session {sid}: showing its result; nothing was run "
            "again (use a new --call-id to run again)") in proc.stderr.decode().splitlines()
    assert proc.stdout.decode() == "old output\n"
    # Another command under the same id is refused (issue 15), never the old result.
    proc = await dsh(real_dshd.socket, "run", "--session", sid, "--call-id", "k1", "--",
                     "echo new")
    assert (proc.returncode, proc.stdout) == (2, b""), proc.stderr
    assert "another command" in proc.stderr.decode()
    assert len(await _tool_calls(real_dshd, sid)) == 1


async def _started(daemon, sid: str, call_id: str) -> None:
    """Wait until the call is running in the lane."""
    async with connect(daemon.socket) as c:
        with trio.fail_after(20):
            async for view in await c.subscribe(sid):
                if view["tools"].get(call_id, {}).get("state") == "running":
                    return


async def test_interrupt_with_cancel_on_interrupt_cancels_and_waits(real_dshd, workdir, tmp_path):
    sid = await _session(real_dshd, workdir)
    run = await Live(tmp_path, "run").start(real_dshd.socket, "run", "--session", sid,
                                            "--call-id", "k2", "--cancel-on-interrupt", "--",
                                            "echo working; sleep 100")
    try:
        with trio.fail_after(20):
            while "working" not in run.out:  # the command runs (not only dispatched)
                await trio.sleep(0.02)
        run.proc.send_signal(signal.SIGINT)
        assert await run.wait() == 130
    finally:
        run.kill()
    assert "dsh: cancelling the command (Ctrl-C again to detach)" in run.err
    assert "detached" not in run.err and "TOOL_CANCELLED" in run.err
    async with connect(real_dshd.socket) as c:
        assert (await c.wait(sid, "k2"))["errorCode"] == "TOOL_CANCELLED"


async def test_attach_shows_the_window_then_live_output_and_exits(real_dshd, workdir, tmp_path):
    sid = await _session(real_dshd, workdir)
    async with connect(real_dshd.socket) as c:
        await c.run_tool(sid, "echo earlier; while [ ! -e go ]; do sleep 0.05; done; echo later",
                         call_id="k3")
    await _started(real_dshd, sid, "k3")
    attach = await Live(tmp_path, "attach").start(real_dshd.socket, "attach", sid)
    try:
        await attach.until("── call k3 (bash, running since")
        (workdir / "go").touch()
        assert await attach.wait() == 0, attach.err
    finally:
        attach.kill()
    assert attach.out == "earlier\nlater\n"
    assert "── call k3 exited 0" in attach.err


async def test_attach_with_nothing_running_says_so(real_dshd, workdir):
    sid = await _session(real_dshd, workdir)
    proc = await dsh(real_dshd.socket, "attach", sid)
    assert proc.returncode == 0
    assert f"no call is running in session {sid}" in proc.stderr.decode()


async def test_rpc_error_is_one_line_and_exit_1(real_dshd):
    proc = await dsh(real_dshd.socket, "attach", "missing")
    assert proc.returncode == 1
    [line] = proc.stderr.decode().splitlines()
    assert line.startswith("dsh: session missing ") and "not found" in line


async def test_wait_and_cancel(real_dshd, workdir):
    sid = await _session(real_dshd, workdir)
    async with connect(real_dshd.socket) as c:
        await c.run_tool(sid, "echo out; exit 4", call_id="k9")
    proc = await dsh(real_dshd.socket, "wait", sid, "k9")
    assert (proc.returncode, proc.stdout) == (4, b"out\n")
    proc = await dsh(real_dshd.socket, "cancel", sid, "k9")
    assert proc.returncode == 1 and "was not running" in proc.stderr.decode()
    proc = await dsh(real_dshd.socket, "--json", "cancel", sid, "k9")
    assert (proc.returncode, json.loads(proc.stdout)) == (1, {"cancelled": False})


async def test_closed_stdout_detaches_with_141(real_dshd, workdir, tmp_path):
    sid = await _session(real_dshd, workdir)
    err = tmp_path / "err"
    with err.open("wb") as fe:
        proc = await trio.lowlevel.open_process(
            dsh_cmd("run", "--session", sid, "--call-id", "k4", "--", "yes"),
            stdout=subprocess.PIPE, stderr=fe, env=env_for(str(real_dshd.socket)), cwd=workdir)
        with trio.fail_after(20):
            first = await proc.stdout.receive_some(100)
            await proc.stdout.aclose()  # like `| head -1`
            await proc.wait()
    assert first.startswith(b"y\n")
    assert proc.returncode == 141
    text = err.read_text()
    assert "stdout was closed; detached, the command keeps running" in text
    assert f"dsh cancel {sid} k4" in text and "Traceback" not in text
    async with connect(real_dshd.socket) as c:
        assert await c.cancel(sid, "k4") is True  # it was still running


# ---------------------------------------------------------------------- strict options of run
@pytest.mark.parametrize("args, wrong", [
    (["run", "--jsn", "--", "echo", "hi"], "--jsn"),
    (["run", "--timout", "5", "--", "true"], "--timout"),
    (["run", "-x", "ls"], "-x"),
])
async def test_run_refuses_unknown_options_before_connecting(tmp_path, args, wrong):
    proc = await dsh(tmp_path / "none.sock", *args)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.decode()
    assert f"No such option: {wrong}" in err or f"No such option '{wrong}'" in err
    assert "not running" not in err  # it never tried to connect
    assert proc.stdout == b""


async def test_log_after_is_checked_before_asking(tmp_path):
    proc = await dsh(tmp_path / "none.sock", "log", "s1", "--after", "-5")
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert "--after" in err and "-5" in err and "not running" not in err


# ---------------------------------------------------------------------- exit status rules
@pytest.mark.parametrize("result, expected", [
    ({"isError": True, "content": "got TERM\nend\n", "errorCode": "TOOL_CANCELLED",
      "details": {"exitCode": 0, "truncation": {"totalBytes": 13}}, "exitCode": 0}, 130),
    ({"isError": True, "content": "", "errorCode": "TOOL_CANCELLED",
      "details": {"exitCode": 143, "truncation": {"totalBytes": 0}}, "exitCode": 143}, 143),
    ({"isError": True, "content": "", "errorCode": "TOOL_CANCELLED", "details": {}}, 130),
    ({"isError": True, "content": "", "errorCode": "TOOL_TIMEOUT",
      "details": {"exitCode": 0}, "exitCode": 0}, 124),
    ({"isError": True, "content": "out", "errorCode": "TOOL_FAILED",
      "details": {"exitCode": 0, "truncation": {"totalBytes": 3}}, "exitCode": 0}, 1),
    ({"isError": True, "content": "out", "errorCode": "TOOL_FAILED",
      "details": {"exitCode": 7, "truncation": {"totalBytes": 3}}, "exitCode": 7}, 7),
    ({"isError": True, "content": "", "details": {"exitCode": 0}, "exitCode": 0}, 1),
    ({"isError": True, "content": "", "details": {"exitCode": -1}, "exitCode": -1}, 1),
    ({"isError": False, "content": "", "details": {"exitCode": 0}, "exitCode": 0}, 0),
])
def test_exit_status_table(result, expected):
    assert status_for(result)[0] == expected


def test_exit_status_is_never_0_for_an_error():
    for code in (None, 0, 1, 255, 300, -3):
        for error_code in (None, "TOOL_TIMEOUT", "TOOL_CANCELLED", "TOOL_FAILED", "X"):
            result = {"isError": True, "content": "", "details": {}}
            if code is not None:
                result["exitCode"] = code
            if error_code:
                result["errorCode"] = error_code
            assert status_for(result)[0] != 0, result


def test_run_help_documents_the_exit_status():
    text = CliRunner().invoke(cli, ["run", "--help"]).output
    for line in ("124  TOOL_TIMEOUT", "130  TOOL_CANCELLED and the command exited 0",
                 "125  the call did not run", "1    any other errorCode with exit code 0"):
        assert line in text


@pytest.mark.parametrize("command", ["run", "attach", "wait"])
def test_help_says_that_close_outages_share_the_reconnect_budget(command):
    text = " ".join(CliRunner().invoke(cli, [command, "--help"]).output.split())
    assert ("An outage that begins less than 5 s after dshd came back shares the earlier "
            "outage's budget") in text, text


# ---------------------------------------------------------------------- the fake peer
@pytest.fixture
async def fake(nursery):
    d = tempfile.mkdtemp(prefix="dsh-c-", dir="/tmp")
    server = FakeDshd(os.path.join(d, "fake.sock"))
    await nursery.start(server.serve)
    yield server
    shutil.rmtree(d, ignore_errors=True)


def _one_call(fake: FakeDshd, batches: list[list], result: dict) -> None:
    """Script ``session.create``, ``tool.run`` (publishing ``batches``) and ``tool.wait``."""
    settled = trio.Event()

    async def create(params):
        return {"sessionId": "s1"}

    async def run(params):
        async def play() -> None:
            await trio.sleep(0.05)
            for batch in batches:
                await fake.publish(batch)
            settled.set()

        fake.nursery.start_soon(play)
        return {"callId": params["callId"]}

    async def wait(params):
        await settled.wait()
        return dict(result, callId=params["callId"])

    fake.handlers.update({"session.create": create, "tool.run": run, "tool.wait": wait})


TEXT = lambda cid: ["tools", cid, "output", "content", 0, "text"]  # noqa: E731
TOTAL = lambda cid: ["tools", cid, "output", "truncation", "totalBytes"]  # noqa: E731


async def test_run_on_a_daemon_without_the_raw_channel_prints_the_result(fake):
    # A daemon without tool.follow (-32601): the final result's window is the output shown,
    # with a line saying so.
    _one_call(fake, [settle_ops("k1", keep=True)],
              {"isError": False, "content": "only in the result\n", "details": {"exitCode": 0},
               "exitCode": 0})
    proc = await dsh(fake.path, "run", "--call-id", "k1", "--", "true")
    assert proc.stdout.decode() == "only in the result\n", proc.stderr
    assert proc.returncode == 0
    assert "the raw output is not available (method tool.follow not found)" in \
        proc.stderr.decode()


async def test_run_that_could_not_be_logged_exits_125(fake):
    async def create(params):
        return {"sessionId": "s1"}

    async def run(params):
        raise FakeError(-32014, "the session log could not be made durable (ENOSPC)")

    fake.handlers.update({"session.create": create, "tool.run": run})
    with trio.fail_after(10):
        proc = await dsh(fake.path, "run", "--", "true")
    assert proc.returncode == 125
    assert proc.stderr.decode().splitlines()[-1].startswith(
        "dsh: STORAGE_FAILURE: the session log could not be made durable (ENOSPC)")


async def test_run_whose_raw_output_breaks_says_what_was_not_shown(fake):
    """The daemon could not read the log ({offset, error}): dsh follows again from that
    offset, a few times, then says how many bytes of the result's total it did not show."""
    c = "k7"
    total = 5000
    follows = []

    async def follow(params):
        follows.append(params["offset"])
        stream = fake._streams[-1]
        fid = f"f{len(follows)}"

        async def play():
            if params["offset"] == 0:
                await fake._send(stream, _output(fid, offset=0, data="bGluZSAwCg=="))
            await fake._send(stream, _output(fid, offset=7, error="dshd cannot read it"))

        fake.nursery.start_soon(play)
        return {"followId": fid}

    _one_call(fake, [settle_ops(c)], {
        "isError": False, "content": "window\n", "exitCode": 0,
        "details": {"exitCode": 0, "truncation": {"truncated": True, "totalBytes": total}}})
    fake.handlers["tool.follow"] = follow
    proc = await dsh(fake.path, "run", "--call-id", c, "--", "flood")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"line 0\n"
    assert follows == [0, 7, 7, 7]  # followed again from where it broke, then given up
    err = proc.stderr.decode()
    assert (f"dsh: {total - 7} of {total} bytes of output were not shown: the raw output "
            "ended at byte 7 (dshd cannot read it)") in err


def _output(follow_id: str, **params) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": "output",
                       "params": {"followId": follow_id, **params}}).encode() + b"\n"


async def test_sessions_cuts_long_titles_and_damage_reasons(fake):
    title = "make " + "x" * 100_000
    reason = "checksum mismatch at byte 123456 " + "y" * 5_000
    rows = [
        {"sessionId": "s1", "title": title, "cwd": "/w", "createdAt": 0, "running": 0,
         "lastSeq": 7},
        {"sessionId": "s2", "title": "a\tb\nc", "cwd": "/w", "createdAt": 0, "running": 0,
         "lastSeq": 3, "damaged": reason},
    ]

    async def listing(params):
        return {"sessions": rows}

    fake.handlers["session.list"] = listing
    proc = await dsh(fake.path, "sessions")
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["NAME", "ID", "STATUS", "CWD", "UPDATED", "EXIT", "TITLE"]
    assert all(len(line) < 200 for line in lines)
    at = lines[0].index("TITLE")  # aligned: every row's title starts under the header's
    first, second = (line for line in lines[1:] if "s1" in line), (
        line for line in lines[1:] if "s2" in line)
    first, second = next(first), next(second)
    assert first[at:].startswith("make xxx") and first.endswith("…")
    assert second[at:].startswith("(checksum mismatch at byte 123456") and " damaged " in second
    assert "…)" in second and second.endswith("a\\tb\\nc")
    proc = await dsh(fake.path, "--json", "sessions")
    assert json.loads(proc.stdout) == rows  # complete
