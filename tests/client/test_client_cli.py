"""The ``dsh`` CLI: pure helpers, errors in-process, and whole commands in a subprocess
against the fake JSON-RPC server (the lead's end-to-end tests use the real dshd)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner

from client.cli import cli
from client.cli.run import command_string
from client.exits import exit_status
from fake_dshd import FakeDshd

ROOT = Path(__file__).resolve().parents[2]


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
    code, message = exit_status(result)
    assert code == expected
    if expected == 125:
        assert message == "dsh: SANDBOX_UNAVAILABLE: The sandbox is unavailable: install bwrap."


def test_exit_status_sentence_comes_from_message_when_content_is_output():
    cancelled = {"isError": True, "content": "partial output\n", "errorCode": "TOOL_CANCELLED",
                 "message": "cancelled; the process group was killed",
                 "details": {"truncation": {"totalBytes": 15}, "exitCode": 143}, "exitCode": 143}
    assert exit_status(cancelled) == (143, "dsh: TOOL_CANCELLED: cancelled; the process group was killed")
    failed = {"isError": True, "content": "output\n", "errorCode": "TOOL_FAILED",
              "details": {"truncation": {"totalBytes": 7}}}
    assert exit_status(failed) == (125, "dsh: TOOL_FAILED")  # the output is not the sentence


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


# ---------------------------------------------------------------------- subprocess + fake server
@pytest.fixture
async def fake(nursery):
    d = tempfile.mkdtemp(prefix="dsh-c-", dir="/tmp")
    server = FakeDshd(os.path.join(d, "fake.sock"))
    await nursery.start(server.serve)
    yield server
    shutil.rmtree(d, ignore_errors=True)


def _dsh_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "client.cli", *args]


def _env(fake: FakeDshd) -> dict[str, str]:
    env = dict(os.environ, DSH_SOCKET=fake.path, PYTHONPATH=str(ROOT))
    env.pop("COLUMNS", None)
    return env


async def dsh(fake: FakeDshd, *args: str) -> subprocess.CompletedProcess:
    return await trio.run_process(_dsh_cmd(*args), capture_stdout=True, capture_stderr=True,
                                  check=False, env=_env(fake), cwd=str(ROOT))


TEXT = lambda cid: ["tools", cid, "output", "content", 0, "text"]  # noqa: E731
TOTAL = lambda cid: ["tools", cid, "output", "truncation", "totalBytes"]  # noqa: E731


async def test_run_prints_live_output_once_and_exits_with_the_exit_code(fake):
    c = "k1"
    fake.call_batches = [
        [["a", TEXT(c), "one\n"], ["s", TOTAL(c), 4]],
        [["a", TEXT(c), "two\n"], ["s", TOTAL(c), 8]],
        [["t", TEXT(c), 4], ["a", TEXT(c), "two\n"], ["s", TOTAL(c), 12]],  # slide, repeated
        [["a", TEXT(c), "end"], ["s", TOTAL(c), 15]],
    ]
    fake.call_result = {"isError": True, "content": "two\ntwo\nend",
                        "details": {"exitCode": 3, "truncation": {"totalBytes": 15}}, "exitCode": 3}
    proc = await dsh(fake, "run", "--call-id", c, "--timeout", "9", "--", "make -j2 | tee x")
    assert proc.stdout.decode() == "one\ntwo\ntwo\nend"
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.decode().splitlines()[0] == f"session s1 call {c}"
    sent = dict(fake.requests)
    assert sent["session.create"]["cwd"] == str(ROOT)
    assert sent["session.create"]["title"] == "make -j2 | tee x"
    assert sent["tool.run"]["arguments"] == {"command": "make -j2 | tee x", "timeout": 9.0}
    assert sent["tool.run"]["approved"] is True
    # Subscribed before running, so no output can be missed.
    methods = [m for m, _ in fake.requests]
    assert methods.index("subscribe") < methods.index("tool.run")


async def test_run_in_an_existing_session_joins_argv(fake):
    fake.call_result = {"isError": False, "content": "", "details": {"exitCode": 0}, "exitCode": 0}
    proc = await dsh(fake, "run", "--session", "s9", "--", "echo", "a b")
    assert proc.returncode == 0, proc.stderr
    sent = dict(fake.requests)
    assert "session.create" not in sent
    assert sent["tool.run"]["sessionId"] == "s9"
    assert sent["tool.run"]["arguments"] == {"command": "echo 'a b'"}


async def test_run_prints_the_final_tail_when_the_stream_missed_it(fake):
    # The call ran and settled between two lane flushes: it shows only in "recent", and the
    # final result supplies the output.
    fake.call_quiet = True
    fake.call_result = {"isError": False, "content": "only in the result\n",
                        "details": {"exitCode": 0}, "exitCode": 0}
    proc = await dsh(fake, "run", "--", "true")
    assert proc.stdout.decode() == "only in the result\n"
    assert proc.returncode == 0


async def test_run_timeout_is_124_and_never_ran_is_125(fake):
    fake.call_result = {"isError": True, "content": "", "errorCode": "TOOL_TIMEOUT",
                        "details": {"exitCode": 143}, "exitCode": 143}
    proc = await dsh(fake, "run", "--timeout", "1", "--", "sleep 9")
    assert proc.returncode == 124 and "TOOL_TIMEOUT" in proc.stderr.decode()

    fake.settled = trio.Event()
    fake.call_result = {"isError": True, "content": "No sandbox provider works here.",
                        "details": {}, "errorCode": "SANDBOX_UNAVAILABLE"}
    proc = await dsh(fake, "run", "--", "true")
    assert proc.returncode == 125
    assert proc.stdout == b""
    assert "SANDBOX_UNAVAILABLE: No sandbox provider works here." in proc.stderr.decode()


async def _interrupt_run(fake: FakeDshd, tmp: Path, *args: str) -> tuple[int, str, str]:
    out, err = tmp / "out", tmp / "err"
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = await trio.lowlevel.open_process(
            _dsh_cmd("run", *args, "--", "sleep 100"), stdout=fo, stderr=fe, env=_env(fake),
            cwd=str(ROOT))
        try:
            with trio.fail_after(10):
                while "tool.wait" not in [m for m, _ in fake.requests]:
                    await trio.sleep(0.01)
                await trio.sleep(0.1)
                proc.send_signal(signal.SIGINT)
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
    return proc.returncode, out.read_text(), err.read_text()


async def test_interrupt_detaches_and_leaves_the_command_running(fake, tmp_path):
    fake.call_batches = [[["a", TEXT("k2"), "working\n"]]]
    fake.call_hold = True
    code, out, err = await _interrupt_run(fake, tmp_path, "--call-id", "k2")
    assert code == 130
    assert out == "working\n"
    assert "detached; the command keeps running. Re-attach: dsh attach s1" in err
    assert not fake.cancelled


async def test_interrupt_with_cancel_on_interrupt_cancels_and_waits(fake, tmp_path):
    fake.call_hold = True
    code, out, err = await _interrupt_run(fake, tmp_path, "--cancel-on-interrupt")
    assert fake.cancelled
    assert ("tool.cancel", {"sessionId": "s1", "callId": fake.call_id}) in fake.requests
    assert code == 130 and "detached" not in err


async def test_attach_shows_the_window_then_live_output_and_exits(fake):
    from fake_dshd import lane, tool_entry

    fake.current_lane = lane(tools={"k3": tool_entry("earlier\n", 8, command="make")})
    fake.call_batches = [[["a", TEXT("k3"), "later\n"], ["s", TOTAL("k3"), 14]]]
    fake.call_result = {"isError": False, "content": "earlier\nlater\n",
                        "details": {"exitCode": 0}, "exitCode": 0}

    async def start_call_soon():
        # Once dsh is subscribed (the base lane is static: a call played before would be lost
        # and dsh would wait for it forever -- python can take long to start on a busy box).
        with trio.fail_after(30):
            while not fake.subscriptions:
                await trio.sleep(0.01)
        await trio.sleep(0.2)
        fake.play("k3", announce=False)

    async with trio.open_nursery() as n:
        n.start_soon(start_call_soon)
        proc = await dsh(fake, "attach", "s1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == "earlier\nlater\n"
    err = proc.stderr.decode()
    assert "── call k3 (bash, running since" in err and ": make" in err
    assert "── call k3 exited 0" in err


async def test_attach_with_nothing_running_says_so(fake):
    proc = await dsh(fake, "attach", "s1")
    assert proc.returncode == 0
    assert "no call is running in session s1" in proc.stderr.decode()


async def test_sessions_log_status_cancel_wait(fake):
    fake.sessions = [
        {"sessionId": "s1", "title": "make", "cwd": "/w", "createdAt": 0, "approvalPolicy": "ask",
         "sandbox": "workspace-write", "running": 1, "lastSeq": 7},
        {"sessionId": "s2", "title": "old", "cwd": "/w", "createdAt": 0, "approvalPolicy": "ask",
         "sandbox": "workspace-write", "running": 0, "lastSeq": 3, "damaged": "torn tail"},
    ]
    proc = await dsh(fake, "sessions")
    lines = proc.stdout.decode().splitlines()
    assert lines[0].split("\t") == ["id", "title", "cwd", "created", "running", "lastSeq"]
    assert lines[1].split("\t")[0] == "s1" and lines[1].split("\t")[-1] == "7"
    assert "DAMAGED (torn tail)" in lines[2]
    proc = await dsh(fake, "--json", "sessions")
    assert json.loads(proc.stdout) == fake.sessions

    fake.events = [{"seq": i, "time": 1_700_000_000_000, "type": "tool/call",
                    "data": {"callId": f"c{i}", "arguments": "{\"command\":\"ls\"}"}}
                   for i in range(1500)]
    proc = await dsh(fake, "log", "s1", "--after", "10", "--json")
    rows = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [r["seq"] for r in rows] == list(range(11, 1500))
    proc = await dsh(fake, "log", "s1", "--after", "1497")
    text = proc.stdout.decode().splitlines()
    assert len(text) == 2 and text[0].split()[0] == "1498" and "tool/call" in text[0]

    proc = await dsh(fake, "status")
    assert "pid: 1" in proc.stdout.decode() and proc.returncode == 0

    proc = await dsh(fake, "cancel", "s1", "k9")
    assert proc.returncode == 0 and "cancelled" in proc.stderr.decode()

    fake.settled.set()
    fake.final_result = {"callId": "k9", "isError": True, "content": "out\n",
                         "details": {"exitCode": 4}, "exitCode": 4}
    proc = await dsh(fake, "wait", "s1", "k9")
    assert (proc.returncode, proc.stdout) == (4, b"out\n")


async def test_rpc_error_is_one_line_and_exit_1(fake):
    proc = await dsh(fake, "attach", "missing")
    assert proc.returncode == 1
    assert proc.stderr.decode() == "dsh: session missing not found; `dsh sessions` lists the sessions\n"


async def test_closed_stdout_detaches_with_141(fake, tmp_path):
    fake.call_batches = [[["a", TEXT("k4"), f"line {i}\n"]] for i in range(300)]
    fake.call_delay = 0.005
    fake.call_hold = True
    err = tmp_path / "err"
    with err.open("wb") as fe:
        proc = await trio.lowlevel.open_process(
            _dsh_cmd("run", "--call-id", "k4", "--", "yes"), stdout=subprocess.PIPE, stderr=fe,
            env=_env(fake), cwd=str(ROOT))
        with trio.fail_after(10):
            first = await proc.stdout.receive_some(100)
            await proc.stdout.aclose()  # like `| head -1`
            await proc.wait()
    assert first.startswith(b"line 0\n")
    assert proc.returncode == 141
    text = err.read_text()
    assert "detached; the command keeps running" in text and "Traceback" not in text
    assert not fake.cancelled


# ---------------------------------------------------------------------- strict options of run
@pytest.mark.parametrize("args, wrong", [
    (["run", "--json", "--", "echo", "hi"], "--json"),
    (["run", "--timout", "5", "--", "true"], "--timout"),
    (["run", "-x", "ls"], "-x"),
])
async def test_run_refuses_unknown_options_before_creating_anything(fake, args, wrong):
    proc = await dsh(fake, *args)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.decode()
    assert f"No such option: {wrong}" in err or f"No such option '{wrong}'" in err
    assert proc.stdout == b""
    assert fake.requests == []  # never connected: no session, no call


@pytest.mark.parametrize("args, command", [
    (["--", "ls", "-la"], "ls -la"),
    (["ls", "-la"], "ls -la"),
    (["--timeout", "5", "sh", "-c", "echo --json"], "sh -c 'echo --json'"),
    (["--", "--weird-name", "--json"], "--weird-name --json"),
])
async def test_run_takes_everything_after_the_options_as_the_command(fake, args, command):
    fake.call_result = {"isError": False, "content": "", "details": {"exitCode": 0}, "exitCode": 0}
    proc = await dsh(fake, "run", *args)
    assert proc.returncode == 0, proc.stderr
    assert dict(fake.requests)["tool.run"]["arguments"]["command"] == command


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
    assert exit_status(result)[0] == expected


def test_exit_status_is_never_0_for_an_error():
    for code in (None, 0, 1, 255, 300, -3):
        for error_code in (None, "TOOL_TIMEOUT", "TOOL_CANCELLED", "TOOL_FAILED", "X"):
            result = {"isError": True, "content": "", "details": {}}
            if code is not None:
                result["exitCode"] = code
            if error_code:
                result["errorCode"] = error_code
            assert exit_status(result)[0] != 0, result


def test_run_help_documents_the_exit_status():
    text = CliRunner().invoke(cli, ["run", "--help"]).output
    for line in ("124  TOOL_TIMEOUT", "130  TOOL_CANCELLED and the command exited 0",
                 "125  the call did not run", "1    any other errorCode with exit code 0"):
        assert line in text


async def test_cancelled_run_whose_command_exits_0_exits_130(fake):
    fake.call_batches = [[["a", TEXT("k5"), "got TERM\nend\n"], ["s", TOTAL("k5"), 13]]]
    fake.call_result = {"isError": True, "content": "got TERM\nend\n",
                        "errorCode": "TOOL_CANCELLED",
                        "message": "cancelled; the process group was killed",
                        "details": {"exitCode": 0, "truncation": {"totalBytes": 13}},
                        "exitCode": 0}
    proc = await dsh(fake, "run", "--call-id", "k5", "--", "sh -c 'trap ... TERM'")
    assert proc.stdout == b"got TERM\nend\n"
    assert proc.returncode == 130
    assert "TOOL_CANCELLED" in proc.stderr.decode()


# ---------------------------------------------------------------------- sessions, log
async def test_sessions_cuts_long_titles_and_damage_reasons(fake):
    title = "make " + "x" * 100_000
    reason = "checksum mismatch at byte 123456 " + "y" * 5_000
    fake.sessions = [
        {"sessionId": "s1", "title": title, "cwd": "/w", "createdAt": 0, "running": 0,
         "lastSeq": 7},
        {"sessionId": "s2", "title": "a\tb\nc", "cwd": "/w", "createdAt": 0, "running": 0,
         "lastSeq": 3, "damaged": reason},
    ]
    proc = await dsh(fake, "sessions")
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 3
    assert all(len(line) < 200 for line in lines)
    first, second = (line.split("\t") for line in lines[1:])
    assert len(first) == len(second) == 6
    assert first[1].startswith("make xxx") and first[1].endswith("…")
    assert second[1].startswith("DAMAGED (checksum mismatch at byte 123456")
    assert "…)" in second[1] and second[1].endswith("a\\tb\\nc")
    proc = await dsh(fake, "--json", "sessions")
    assert json.loads(proc.stdout) == fake.sessions  # complete


async def test_log_after_is_checked_before_asking(fake):
    proc = await dsh(fake, "log", "s1", "--after", "-5")
    assert proc.returncode == 2
    assert "--after" in proc.stderr.decode() and "-5" in proc.stderr.decode()
    assert fake.requests == []
    fake.events = [{"seq": 0, "time": 0, "type": "x", "data": {}}]
    proc = await dsh(fake, "log", "s1", "--after", "-1")
    assert proc.returncode == 0 and proc.stdout.decode().split()[0] == "0"


# ---------------------------------------------------------------------- output from the spill
def _spilled_output(text: str, total: int, spill: str) -> dict:
    return {"content": [{"type": "text", "text": text}], "details": {"spillPath": spill},
            "truncation": {"truncated": True, "truncatedBy": "lines", "totalBytes": total,
                           "totalLines": 0, "maxBytes": 51200, "maxLines": 50}}


async def test_run_prints_what_slid_out_of_the_window_from_the_spill_file(fake, tmp_path):
    c = "k6"
    full = b"".join(b"line %d\n" % i for i in range(5000))
    spill = tmp_path / "spill" / f"{c}.log"
    spill.parent.mkdir()
    spill.write_bytes(full)
    window = b"".join(full.splitlines(keepends=True)[-50:]).decode()
    fake.call_batches = [
        [["a", TEXT(c), "line 0\nline 1\n"], ["s", TOTAL(c), 14]],
        # The window slid far past what dsh printed (a flood between two lane flushes).
        [["s", ["tools", c, "output"], _spilled_output(window, len(full), str(spill))]],
    ]
    fake.call_result = {"isError": False, "content": window, "exitCode": 0,
                        "details": {"exitCode": 0, "spillPath": str(spill),
                                    "truncation": {"truncated": True, "totalBytes": len(full)}}}
    proc = await dsh(fake, "run", "--call-id", c, "--", "flood")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == full
    assert "not shown" not in proc.stderr.decode()


async def test_run_with_an_unreadable_spill_file_says_what_was_not_shown(fake, tmp_path):
    c = "k7"
    full = b"".join(b"line %d\n" % i for i in range(5000))
    window = b"".join(full.splitlines(keepends=True)[-50:]).decode()
    spill = tmp_path / "a-directory"  # opens, but cannot be read
    spill.mkdir()
    fake.call_batches = [
        [["a", TEXT(c), "line 0\nline 1\n"], ["s", TOTAL(c), 14]],
        [["s", ["tools", c, "output"], _spilled_output(window, len(full), str(spill))]],
    ]
    fake.call_result = {"isError": False, "content": window, "exitCode": 0,
                        "details": {"exitCode": 0, "spillPath": str(spill),
                                    "truncation": {"truncated": True, "totalBytes": len(full)}}}
    proc = await dsh(fake, "run", "--call-id", c, "--", "flood")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"line 0\nline 1\n" + window.encode()  # the window, as before
    err = proc.stderr.decode()
    assert f"cannot read the spill file {spill}" in err
    missing = len(full) - len(proc.stdout)
    assert f"dsh: {missing} of {len(full)} bytes of output were not shown" in err
    assert f"the full output is in {spill}" in err
