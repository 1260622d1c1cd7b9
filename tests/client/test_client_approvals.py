"""Approvals in the client (PROTOCOL.md §3.4): the answerer's pieces, ``dsh attach --approve``
with answers piped to stdin, ``dsh approve``, ``dsh run --ask``, ``dsh policy`` -- against a
real dshd; and, against the fake peer, the two answers a real dshd cannot be made to give (a
decision refused while the lane still shows the request; a lane whose sandbox mode disagrees
with ``session.get``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from client.api import connect
from client.cli.answer import LineReader, Outcomes, parse_answer, request_lines, sandbox_label, visible
from protocol.methods import SandboxInfo
from client.exits import single as _single
from client.transport import ConnectionLost
from dsh_proc import Live, dsh
from fake_dshd import FakeDshd, FakeError, lane, settle_ops, tool_entry


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="dsh-w-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _ask_session(daemon, workdir: Path) -> str:
    async with connect(daemon.socket) as c:
        return await c.create_session(workdir, approval_policy="ask")


async def _pending_of(sub, call_id: str) -> str:
    with trio.fail_after(20):
        async for view in sub:
            for aid, request in view["approvals"].items():
                if request["callId"] == call_id:
                    return aid
    raise AssertionError("stream ended")


@asynccontextmanager
async def pending(daemon, workdir: Path, command: str, call_id: str):
    """A session with ``call_id`` waiting for approval, and an answerer (ours) attached while
    the block runs: (session id, approval id, the answerer's client)."""
    sid = await _ask_session(daemon, workdir)
    async with connect(daemon.socket, "test-answerer", approvals=True) as ans:
        async with await ans.subscribe(sid) as sub:
            await ans.run_tool(sid, command, call_id=call_id, approved=False)
            aid = await _pending_of(sub, call_id)
            yield sid, aid, ans


# ---------------------------------------------------------------------- pure pieces
def test_parse_answer():
    assert [parse_answer(a) for a in ("y", " YES ", "n", "No", "", "maybe", "yy")] == [
        "allow", "allow", "reject", "reject", None, None, None]


def test_request_lines_show_the_whole_command_with_control_characters_visible():
    summary = "make install &&\necho done\rrm -rf ~ \x1b[2K" + "x" * 300
    lines = request_lines("s1", "a-1", {"callId": "c1", "tool": "bash", "summary": summary},
                          "workspace-write", SandboxInfo(provider="bwrap", completeness="full"))
    assert lines[0] == ("── approval a-1: call c1 in session s1 asks to run bash, "
                        "sandbox workspace-write (provider bwrap):")
    assert lines[1] == "    make install &&"
    assert lines[2] == "    echo done\\x0drm -rf ~ \\x1b[2K" + "x" * 300  # never truncated
    assert lines[3] == "    (control characters are shown escaped, as \\xNN)"
    assert visible("tab\tand\nnewline stay; \u2028 does not") == "tab\tand\nnewline stay; \\u2028 does not"


def test_sandbox_label_says_when_nothing_confines():
    assert sandbox_label("read-only", SandboxInfo(provider="bwrap", completeness="full")) == \
        "sandbox read-only (provider bwrap)"
    assert sandbox_label("workspace-write",
                         SandboxInfo(provider="landlock", completeness="partial")) == \
        "sandbox workspace-write (provider landlock, partial)"
    assert sandbox_label("workspace-write", SandboxInfo(provider="none", completeness="none")) == \
        "sandbox workspace-write (provider none: NOT confined)"
    assert sandbox_label("danger-full-access", SandboxInfo(provider="bwrap", completeness="full")) == \
        "sandbox danger-full-access (not confined)"
    assert sandbox_label(None, None) == "sandbox ?"


async def test_line_reader_from_a_pipe_keeps_every_line_in_order_and_eof_sticks():
    r, w = os.pipe()
    os.write(w, b"y\r\nmaybe\nn")
    os.close(w)
    reader = LineReader(r)
    assert not reader.tty
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.run)
        # From a pipe, lines that came before the prompt still count (since is ignored).
        await trio.sleep(0.05)
        assert await reader.line(since=trio.current_time()) == "y"
        assert await reader.line() == "maybe"
        assert await reader.line() == "n"  # the last line without a newline
        assert await reader.line() is None
        assert await reader.line() is None
    os.close(r)


async def test_line_reader_on_a_terminal_drops_type_ahead():
    master, slave = os.openpty()
    reader = LineReader(slave)
    assert reader.tty
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.run)
            os.write(master, b"y\n")  # typed for a request that was decided meanwhile
            await trio.sleep(0.2)
            since = trio.current_time()
            os.write(master, b"n\n")
            assert await reader.line(since) == "n"
            nursery.cancel_scope.cancel()
    finally:
        os.close(master)
        os.close(slave)


def test_single_picks_the_client_error_out_of_a_group():
    lost = ConnectionLost("dshd closed the connection")
    group = ExceptionGroup("nursery", [ConnectionLost("dshd closed the connection"),
                                       ExceptionGroup("inner", [lost])])
    assert isinstance(_single(group), ConnectionLost)
    bug = ExceptionGroup("nursery", [ValueError("a"), KeyError("b")])
    assert _single(bug) is bug


# ---------------------------------------------------------------------- dsh attach --approve
async def test_attach_approve_answers_y_from_a_pipe_and_follows_the_call(real_dshd, workdir):
    async with pending(real_dshd, workdir, "echo built", "k1") as (sid, aid, ans):
        proc = await dsh(real_dshd.socket, "attach", "--approve", sid, stdin=b"maybe\ny\n")
        result = await ans.wait(sid, "k1")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert proc.stdout.decode() == "built\n"  # stdout is the call's output, nothing else
    assert (f"── approval {aid}: call k1 in session {sid} asks to run bash, sandbox "
            "workspace-write (provider bwrap):\n    echo built\n") in err
    assert "allow it once? [y/n] maybe\nanswer y (allow it once) or n (reject it)\n" in err
    assert f"allow it once? [y/n] y\n── approval {aid}: allowed-once\n" in err
    assert "── call k1 exited 0" in err
    assert err.index("waiting-approval") < err.index("── approval") < err.index("(bash, running")
    assert result["exitCode"] == 0


async def test_attach_approve_n_rejects_and_the_call_ends_without_running(real_dshd, workdir):
    async with pending(real_dshd, workdir, "echo never", "k2") as (sid, aid, ans):
        proc = await dsh(real_dshd.socket, "attach", "--approve", sid, stdin=b"n\n")
        result = await ans.wait(sid, "k2")
        outcomes = Outcomes(ans, sid, -1)
        assert await outcomes.lookup(aid) == "rejected"
        assert await outcomes.lookup("a-unknown") is None
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert proc.stdout == b""
    assert f"── approval {aid}: rejected" in err
    assert "── call k2 ended: APPROVAL_REJECTED" in err
    assert result["errorCode"] == "APPROVAL_REJECTED"


async def test_attach_approve_shows_a_request_decided_elsewhere_while_prompting(real_dshd,
                                                                                workdir, tmp_path):
    async with pending(real_dshd, workdir, "deploy", "k3") as (sid, aid, ans):
        live = await Live(tmp_path, "attach").start(real_dshd.socket, "attach", "--approve", sid)
        try:
            await live.until("allow it once? [y/n] ")
            assert await ans.decide(sid, aid, "reject") == "rejected"  # we were quicker
            assert await live.wait() == 0
        finally:
            live.kill()
    assert f"── approval {aid} was decided elsewhere: rejected" in live.err
    assert "── call k3 ended: APPROVAL_REJECTED" in live.err


async def test_attach_approve_with_stdin_closed_detaches_with_1(real_dshd, workdir):
    async with pending(real_dshd, workdir, "make", "k5") as (sid, aid, ans):
        proc = await dsh(real_dshd.socket, "attach", "--approve", sid, stdin=b"")
    err = proc.stderr.decode()
    assert proc.returncode == 1
    assert (f"dsh: stdin is closed, so nobody can answer approval {aid} here; detaching "
            "(another answerer may decide it, else it ends unavailable)\n") in err
    async with connect(real_dshd.socket) as c:  # the last answerer left: nobody else to ask
        assert (await c.wait(sid, "k5"))["errorCode"] == "APPROVAL_UNAVAILABLE"


async def test_attach_approve_with_nothing_pending_says_so(real_dshd, workdir):
    sid = await _ask_session(real_dshd, workdir)
    proc = await dsh(real_dshd.socket, "attach", "--approve", sid)
    assert proc.returncode == 0
    assert f"no call is running and no approval is pending in session {sid}" in proc.stderr.decode()


async def test_attach_approve_refuses_call(tmp_path):
    proc = await dsh(tmp_path / "none.sock", "attach", "--approve", "--call", "k", "s1")
    assert proc.returncode == 2 and "--approve" in proc.stderr.decode()


def _approval_in(err: str, sid: str) -> str:
    return err.split(f"`dsh approve {sid} ", 1)[1].split("`", 1)[0]


async def test_answerer_follows_and_approves_run_asks_as_they_come(real_dshd, workdir, tmp_path):
    async with pending(real_dshd, workdir, "echo built", "k6") as (sid, aid, ans):
        attach = await Live(tmp_path, "attach").start(real_dshd.socket, "attach", "--approve",
                                                      "--follow", sid)
        run = Live(tmp_path, "run")
        try:
            await attach.until(f"── approval {aid}: call k6")
            await attach.write(b"y\n")
            await attach.until("── call k6 exited 0")
            # Now a request comes while it is attached.
            await run.start(real_dshd.socket, "run", "--ask", "--session", sid, "--call-id",
                            "k7", "--", "echo again")
            await run.until("dsh: call k7 waits for approval ")
            second = _approval_in(run.err, sid)
            assert (f"dsh: call k7 waits for approval {second}: answer with `dsh approve {sid} "
                    f"{second}` (--reject to refuse) or `dsh attach --approve {sid}`") in run.err
            await attach.until(f"── approval {second}: call k7")
            await attach.write(b"y\n")
            assert await run.wait() == 0
            assert run.out == "again\n"
            await attach.until("── call k7 exited 0")
            attach.proc.send_signal(signal.SIGINT)  # --follow: only Ctrl-C ends it
            assert await attach.wait() == 130
        finally:
            attach.kill()
            run.kill()
    assert attach.out == "built\nagain\n"
    assert f"── approval {second}: allowed-once" in attach.err


# ---------------------------------------------------------------------- dsh approve / run --ask
async def test_run_ask_waits_and_dsh_approve_decides(real_dshd, workdir, tmp_path):
    async with pending(real_dshd, workdir, "true", "k0") as (sid, _, ans):
        run = await Live(tmp_path, "run").start(real_dshd.socket, "run", "--ask", "--session",
                                                sid, "--call-id", "k7", "--", "echo built")
        try:
            await run.until(f"dsh approve {sid} ")
            aid = _approval_in(run.err, sid)
            proc = await dsh(real_dshd.socket, "approve", sid, aid)
            assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"allowed-once\n", b"")
            assert await run.wait() == 0
        finally:
            run.kill()
    assert run.out == "built\n"
    proc = await dsh(real_dshd.socket, "approve", "--reject", sid, aid)
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr.decode() == f"dsh: approval {aid} already decided: allowed-once\n"
    proc = await dsh(real_dshd.socket, "--json", "approve", sid, aid)
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {"outcome": "allowed-once", "alreadyDecided": True}
    proc = await dsh(real_dshd.socket, "approve", sid, "a-404")
    assert proc.returncode == 1
    [line] = proc.stderr.decode().splitlines()
    assert line.startswith("dsh: approval a-404 not found")


async def test_approve_reject_prints_rejected_and_run_ask_exits_125(real_dshd, workdir, tmp_path):
    async with pending(real_dshd, workdir, "true", "k0") as (sid, _, ans):
        run = await Live(tmp_path, "run").start(real_dshd.socket, "run", "--ask", "--session",
                                                sid, "--", "echo never")
        try:
            await run.until(f"dsh approve {sid} ")
            aid = _approval_in(run.err, sid)
            proc = await dsh(real_dshd.socket, "--json", "approve", "--reject", sid, aid)
            assert (proc.returncode, json.loads(proc.stdout)) == (0, {"outcome": "rejected"})
            assert await run.wait() == 125
        finally:
            run.kill()
    assert run.out == ""
    assert "dsh: APPROVAL_REJECTED: " in run.err


async def test_run_ask_without_answerer_is_125_and_says_how(real_dshd, workdir):
    sid = await _ask_session(real_dshd, workdir)
    proc = await dsh(real_dshd.socket, "run", "--ask", "--ask-timeout", "0", "--session", sid,
                     "--", "make")
    err = proc.stderr.decode()
    assert proc.returncode == 125
    assert "dsh: APPROVAL_UNAVAILABLE: " in err
    assert (f"dsh: keep an answerer attached (`dsh attach --approve --follow {sid}` in another "
            f"terminal), then run it again with `dsh run --ask --session {sid}`") in err


async def test_run_ask_interrupted_while_waiting_says_it_still_waits(real_dshd, workdir, tmp_path):
    async with pending(real_dshd, workdir, "true", "k0") as (sid, _, ans):
        run = await Live(tmp_path, "run").start(real_dshd.socket, "run", "--ask", "--session",
                                                sid, "--call-id", "k8", "--", "echo later")
        try:
            await run.until(f"dsh approve {sid} ")
            aid = _approval_in(run.err, sid)
            run.proc.send_signal(signal.SIGINT)
            assert await run.wait() == 130
        finally:
            run.kill()
        assert (f"detached; the call still waits for approval {aid} (`dsh approve {sid} "
                f"{aid}`). Re-attach: dsh attach {sid}") in run.err
        # Still pending: detaching decided nothing.
        assert await ans.decide(sid, aid, "allow") == "allowed-once"
        assert (await ans.wait(sid, "k8"))["exitCode"] == 0


async def test_run_passes_sandbox_and_policy_to_the_new_session(real_dshd, workdir):
    proc = await dsh(real_dshd.socket, "run", "--sandbox", "read-only", "--policy", "never",
                     "--", "true", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    sid = proc.stderr.decode().split("session ", 1)[1].split()[0]
    async with connect(real_dshd.socket) as c:
        info = await c.get_session(sid)
    assert (info["sandbox"], info["approvalPolicy"]) == ("read-only", "never")
    proc = await dsh(real_dshd.socket, "run", "--session", sid, "--policy", "ask", "--", "ls")
    assert proc.returncode == 2 and "dsh policy SESSION" in proc.stderr.decode()
    proc = await dsh(real_dshd.socket, "run", "--sandbox", "sideways", "--", "ls")
    assert proc.returncode == 2


async def test_policy_command(real_dshd, workdir):
    sid = await _ask_session(real_dshd, workdir)
    proc = await dsh(real_dshd.socket, "policy", sid, "never")
    assert (proc.returncode, proc.stdout) == (0, b"")
    assert proc.stderr.decode() == f"session {sid}: approval policy never\n"
    async with connect(real_dshd.socket) as c:
        assert (await c.get_session(sid))["approvalPolicy"] == "never"
    proc = await dsh(real_dshd.socket, "--json", "policy", sid, "ask")
    assert json.loads(proc.stdout) == {"sessionId": sid, "approvalPolicy": "ask"}
    proc = await dsh(real_dshd.socket, "policy", sid, "sometimes")
    assert proc.returncode == 2
    proc = await dsh(real_dshd.socket, "policy", "missing", "ask")
    assert proc.returncode == 1


# ---------------------------------------------------------------------- the fake peer
@pytest.fixture
async def fake(nursery):
    d = tempfile.mkdtemp(prefix="dsh-a-", dir="/tmp")
    server = FakeDshd(os.path.join(d, "fake.sock"))
    await nursery.start(server.serve)
    yield server
    shutil.rmtree(d, ignore_errors=True)


def _waiting(fake: FakeDshd, call_id: str, command: str, info: dict | None = None) -> trio.Event:
    """A lane with ``call_id`` waiting for approval a-1; ``tool.wait`` answers once the
    returned event is set (after the test published the call's end)."""
    fake.lane = lane(tools={call_id: tool_entry(command=command, state="waiting-approval")},
                     approvals={"a-1": {"callId": call_id, "tool": "bash", "summary": command,
                                        "askedAt": 0}})
    settled = trio.Event()
    result = {"callId": call_id, "isError": False, "content": "built\n", "exitCode": 0,
              "details": {"exitCode": 0, "truncation": {"totalBytes": 6}}}

    async def get(params):
        return info or {"sessionId": "s1", "lastSeq": -1}

    async def events(params):
        return {"events": [], "lastSeq": -1}

    async def wait(params):
        await settled.wait()
        return result

    fake.handlers.update({"session.get": get, "session.events": events, "tool.wait": wait})
    return settled


async def _run_allowed(fake: FakeDshd, call_id: str) -> None:
    """Publish what dshd would after allowing the call: it runs, prints, settles."""
    text = ["tools", call_id, "output", "content", 0, "text"]
    await fake.publish([["d", ["approvals", "a-1"]], ["s", ["tools", call_id, "state"], "running"]])
    await fake.publish([["a", text, "built\n"],
                        ["s", ["tools", call_id, "output", "truncation", "totalBytes"], 6]])
    await fake.publish(settle_ops(call_id))


async def test_attach_approve_already_decided_answer_is_graceful(fake, tmp_path):
    # Decided elsewhere, and the lane has not shown it yet when our answer comes.
    settled = _waiting(fake, "k4", "deploy")

    async def decide(params):
        raise FakeError(-32011, "approval a-1 was already decided: allowed-once",
                        {"outcome": "allowed-once"})

    fake.handlers["approval.decide"] = decide
    live = await Live(tmp_path, "attach").start(fake.path, "attach", "--approve", "s1")
    try:
        await live.until("allow it once? [y/n] ")
        await live.write(b"n\n")
        await live.until("── approval a-1 was already decided elsewhere: allowed-once")
        await _run_allowed(fake, "k4")
        settled.set()
        assert await live.wait() == 0
    finally:
        live.kill()
    assert live.out == "built\n"
    assert "Traceback" not in live.err


async def test_attach_approve_shows_the_sandbox_mode_the_call_runs_under(fake):
    # SessionInfo says read-only; the lane (as dshd has published it) says the config default.
    settled = _waiting(fake, "k8", "cat /etc/passwd",
                       {"sessionId": "s1", "lastSeq": -1, "sandbox": "read-only"})

    async def decide(params):
        async def end() -> None:
            await fake.publish([["d", ["approvals", "a-1"]]])
            await fake.publish(settle_ops("k8", exit_code=None, error_code="APPROVAL_REJECTED"))
            settled.set()

        fake.nursery.start_soon(end)
        return {"outcome": "rejected"}

    fake.handlers["approval.decide"] = decide
    proc = await dsh(fake.path, "attach", "--approve", "s1", stdin=b"n\n")
    assert proc.returncode == 0, proc.stderr
    assert ("── approval a-1: call k8 in session s1 asks to run bash, sandbox read-only "
            "(provider bwrap):") in proc.stderr.decode()
