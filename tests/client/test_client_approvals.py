"""Approvals in the client (PROTOCOL.md §3.4): the answerer's pieces, ``dsh attach --approve``
with answers piped to stdin, ``dsh approve``, ``dsh run --ask``, ``dsh policy`` -- against the
fake server (the lead's end-to-end tests use the real dshd)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile

import pytest
import trio

from client.cli.answer import LineReader, Outcomes, parse_answer, request_lines, sandbox_label, visible
from client.api import connect
from client.exits import single as _single
from client.transport import ConnectionLost
from dsh_proc import Live, dsh
from fake_dshd import FakeDshd, lane

TEXT = lambda cid: ["tools", cid, "output", "content", 0, "text"]  # noqa: E731
TOTAL = lambda cid: ["tools", cid, "output", "truncation", "totalBytes"]  # noqa: E731
OK = {"isError": False, "content": "built\n", "details": {"exitCode": 0,
      "truncation": {"totalBytes": 6}}, "exitCode": 0}


@pytest.fixture
async def fake(nursery):
    d = tempfile.mkdtemp(prefix="dsh-a-", dir="/tmp")
    server = FakeDshd(os.path.join(d, "fake.sock"))
    await nursery.start(server.serve)
    yield server
    shutil.rmtree(d, ignore_errors=True)


def _script_output(fake: FakeDshd, call_id: str) -> None:
    fake.call_batches = [[["a", TEXT(call_id), "built\n"], ["s", TOTAL(call_id), 6]]]
    fake.call_result = dict(OK)


def _sent(fake: FakeDshd, method: str) -> list:
    return [params for m, params in fake.requests if m == method]


# ---------------------------------------------------------------------- pure pieces
def test_parse_answer():
    assert [parse_answer(a) for a in ("y", " YES ", "n", "No", "", "maybe", "yy")] == [
        "allow", "allow", "reject", "reject", None, None, None]


def test_request_lines_show_the_whole_command_with_control_characters_visible():
    summary = "make install &&\necho done\rrm -rf ~ \x1b[2K" + "x" * 300
    lines = request_lines("s1", "a-1", {"callId": "c1", "tool": "bash", "summary": summary},
                          "workspace-write", {"provider": "bwrap", "completeness": "full"})
    assert lines[0] == ("── approval a-1: call c1 in session s1 asks to run bash, "
                        "sandbox workspace-write (provider bwrap):")
    assert lines[1] == "    make install &&"
    assert lines[2] == "    echo done\\x0drm -rf ~ \\x1b[2K" + "x" * 300  # never truncated
    assert lines[3] == "    (control characters are shown escaped, as \\xNN)"
    assert visible("tab\tand\nnewline stay; \u2028 does not") == "tab\tand\nnewline stay; \\u2028 does not"


def test_sandbox_label_says_when_nothing_confines():
    assert sandbox_label("read-only", {"provider": "bwrap", "completeness": "full"}) == \
        "sandbox read-only (provider bwrap)"
    assert sandbox_label("workspace-write", {"provider": "landlock", "completeness": "partial"}) == \
        "sandbox workspace-write (provider landlock, partial)"
    assert sandbox_label("workspace-write", {"provider": "none", "completeness": "none"}) == \
        "sandbox workspace-write (provider none: NOT confined)"
    assert sandbox_label("danger-full-access", {"provider": "bwrap"}) == \
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


# ---------------------------------------------------------------------- api
async def test_decide_and_set_policy_calls(fake):
    aid = fake.pending_ask("c1", "make")
    async with connect(fake.path, approvals=True) as c:
        await c.set_policy("s1", "never")
        assert await c.decide("s1", aid, "reject") == "rejected"
        outcomes = Outcomes(c, "s1", -1)
        assert await outcomes.lookup(aid) == "rejected"
        assert await outcomes.lookup("a-unknown") is None
    assert _sent(fake, "initialize")[0]["capabilities"] == {"approvals": True}
    assert _sent(fake, "session.setApprovalPolicy") == [{"sessionId": "s1", "policy": "never"}]
    assert _sent(fake, "approval.decide") == [
        {"sessionId": "s1", "approvalId": aid, "decision": "reject"}]


async def test_resubscribe_keeps_an_answerer_attached(fake):
    # Make before break: the new subscription is taken before the old one is dropped.
    fake.on_subscribe = [lambda i: [[["r", lane()]], [["s", ["turn"], 1]]],
                         lambda i: [[["r", lane()]]]]
    async with connect(fake.path, approvals=True) as c:
        sub = await c.subscribe("s1")
        await sub.next_view()
        await sub.next_view()
        await fake._conns[0].notify_stream("sub0", [["s", ["turn"], 3]], seq=7)  # a gap
        await sub.next_view()
        assert sub.subscription_id == "sub1"
    methods = [(m, p) for m, p in fake.requests if m in ("subscribe", "unsubscribe")]
    assert methods[:3] == [("subscribe", {"sessionId": "s1"}), ("subscribe", {"sessionId": "s1"}),
                           ("unsubscribe", {"subscriptionId": "sub0"})]


# ---------------------------------------------------------------------- dsh attach --approve
async def test_attach_approve_answers_y_from_a_pipe_and_follows_the_call(fake):
    aid = fake.pending_ask("k1", "make install && echo 'ok'")
    _script_output(fake, "k1")
    proc = await dsh(fake.path, "attach", "--approve", "s1", stdin=b"maybe\ny\n")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert proc.stdout.decode() == "built\n"  # stdout is the call's output, nothing else
    assert (f"── approval {aid}: call k1 in session s1 asks to run bash, sandbox "
            "workspace-write (provider bwrap):\n    make install && echo 'ok'\n") in err
    assert "allow it once? [y/n] maybe\nanswer y (allow it once) or n (reject it)\n" in err
    assert f"allow it once? [y/n] y\n── approval {aid}: allowed-once\n" in err
    assert "── call k1 exited 0" in err
    assert err.index("waiting-approval") < err.index("── approval") < err.index("(bash, running")
    assert _sent(fake, "initialize")[0]["capabilities"] == {"approvals": True}
    assert _sent(fake, "approval.decide") == [
        {"sessionId": "s1", "approvalId": aid, "decision": "allow"}]


async def test_attach_approve_n_rejects_and_the_call_ends_without_running(fake):
    aid = fake.pending_ask("k2", "rm -rf build")
    proc = await dsh(fake.path, "attach", "--approve", "s1", stdin=b"n\n")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert proc.stdout == b""
    assert f"── approval {aid}: rejected" in err
    assert "── call k2 ended: APPROVAL_REJECTED" in err
    assert fake.decisions == {aid: "rejected"}


async def test_attach_approve_shows_a_request_decided_elsewhere_while_prompting(fake, tmp_path):
    aid = fake.pending_ask("k3", "deploy")
    live = await Live(tmp_path, "attach").start(fake.path, "attach", "--approve", "s1")
    try:
        await live.until("allow it once? [y/n] ")
        fake.decide_elsewhere(aid, "rejected")  # another answerer was quicker
        assert await live.wait() == 0
    finally:
        live.kill()
    assert f"── approval {aid} was decided elsewhere: rejected" in live.err
    assert "── call k3 ended: APPROVAL_REJECTED" in live.err
    assert _sent(fake, "approval.decide") == []


async def test_attach_approve_already_decided_answer_is_graceful(fake, tmp_path):
    aid = fake.pending_ask("k4", "deploy")
    live = await Live(tmp_path, "attach").start(fake.path, "attach", "--approve", "s1")
    try:
        await live.until("allow it once? [y/n] ")
        # Decided elsewhere, but the lane has not shown it yet when the answer comes.
        fake.decide_elsewhere(aid, "allowed-once", publish=False)
        _script_output(fake, "k4")
        await live.write(b"n\n")
        await live.until(f"── approval {aid} was already decided elsewhere: allowed-once")
        fake.release(aid)
        assert await live.wait() == 0
    finally:
        live.kill()
    assert live.out == "built\n"
    assert "Traceback" not in live.err


async def test_attach_approve_with_stdin_closed_detaches_with_1(fake):
    aid = fake.pending_ask("k5", "make")
    proc = await dsh(fake.path, "attach", "--approve", "s1", stdin=b"")
    err = proc.stderr.decode()
    assert proc.returncode == 1
    assert (f"dsh: stdin is closed, so nobody can answer approval {aid} here; detaching "
            "(another answerer may decide it, else it ends unavailable)\n") in err
    with trio.fail_after(5):
        while aid not in fake.decisions:
            await trio.sleep(0.01)
    assert fake.decisions[aid] == "unavailable"  # the answerer left: nobody else to ask


async def test_attach_approve_with_nothing_pending_says_so(fake):
    proc = await dsh(fake.path, "attach", "--approve", "s1")
    assert proc.returncode == 0
    assert "no call is running and no approval is pending in session s1" in proc.stderr.decode()


async def test_attach_approve_refuses_call(fake):
    proc = await dsh(fake.path, "attach", "--approve", "--call", "k", "s1")
    assert proc.returncode == 2 and "--approve" in proc.stderr.decode()


async def test_answerer_follows_and_approves_a_run_ask_as_it_comes(fake, tmp_path):
    _script_output(fake, "k6")
    attach = await Live(tmp_path, "attach").start(fake.path, "attach", "--approve", "--follow", "s1")
    run = Live(tmp_path, "run")
    try:
        with trio.fail_after(10):
            while not fake.has_answerer():
                await trio.sleep(0.01)
        await run.start(fake.path, "run", "--ask", "--session", "s1", "--call-id", "k6", "--",
                        "make")
        await run.until("dsh: call k6 waits for approval a-1: answer with "
                        "`dsh approve s1 a-1` (--reject to refuse) or `dsh attach --approve s1`")
        await attach.until("allow it once? [y/n] ")
        await attach.write(b"y\n")
        assert await run.wait() == 0
        assert run.out == "built\n"
        await attach.until("── call k6 exited 0")
        attach.proc.send_signal(signal.SIGINT)  # --follow: only Ctrl-C ends it
        assert await attach.wait() == 130
    finally:
        attach.kill()
        run.kill()
    assert attach.out == "built\n"
    assert "── approval a-1: allowed-once" in attach.err
    assert [p["approved"] for p in _sent(fake, "tool.run")] == [False]


# ---------------------------------------------------------------------- dsh approve / run --ask
async def test_run_ask_waits_and_dsh_approve_decides(fake, tmp_path):
    fake.assume_answerer = True
    _script_output(fake, "k7")
    run = await Live(tmp_path, "run").start(fake.path, "run", "--ask", "--call-id", "k7", "--",
                                            "make")
    try:
        await run.until("dsh approve s1 a-1")
        proc = await dsh(fake.path, "approve", "s1", "a-1")
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"allowed-once\n", b"")
        assert await run.wait() == 0
    finally:
        run.kill()
    assert run.out == "built\n"

    proc = await dsh(fake.path, "approve", "--reject", "s1", "a-1")
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr.decode() == "dsh: approval a-1 already decided: allowed-once\n"
    proc = await dsh(fake.path, "--json", "approve", "s1", "a-1")
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {"outcome": "allowed-once", "alreadyDecided": True}
    proc = await dsh(fake.path, "approve", "s1", "a-404")
    assert proc.returncode == 1
    assert proc.stderr.decode() == "dsh: approval a-404 not found in session s1\n"
    assert [p["decision"] for p in _sent(fake, "approval.decide")] == ["allow", "reject", "allow",
                                                                      "allow"]


async def test_approve_reject_prints_rejected_and_run_ask_exits_125(fake, tmp_path):
    fake.assume_answerer = True
    run = await Live(tmp_path, "run").start(fake.path, "run", "--ask", "--", "make")
    try:
        await run.until("dsh approve s1 a-1")
        proc = await dsh(fake.path, "--json", "approve", "--reject", "s1", "a-1")
        assert (proc.returncode, json.loads(proc.stdout)) == (0, {"outcome": "rejected"})
        assert await run.wait() == 125
    finally:
        run.kill()
    assert run.out == ""
    assert "dsh: APPROVAL_REJECTED: the call was rejected; it did not run." in run.err


async def test_run_ask_without_answerer_is_125_and_says_how(fake):
    proc = await dsh(fake.path, "run", "--ask", "--", "make")
    err = proc.stderr.decode()
    assert proc.returncode == 125
    assert "dsh: APPROVAL_UNAVAILABLE: nobody was attached to approve this call." in err
    assert ("dsh: keep an answerer attached (`dsh attach --approve --follow s1` in another "
            "terminal), then run it again with `dsh run --ask --session s1`") in err
    assert _sent(fake, "tool.run")[0]["approved"] is False


async def test_run_passes_sandbox_and_policy_to_the_new_session(fake):
    fake.call_result = dict(OK, content="")
    proc = await dsh(fake.path, "run", "--sandbox", "read-only", "--policy", "never", "--", "ls")
    assert proc.returncode == 0, proc.stderr
    create = _sent(fake, "session.create")[0]
    assert (create["sandbox"], create["approvalPolicy"]) == ("read-only", "never")
    assert _sent(fake, "tool.run")[0]["approved"] is True

    proc = await dsh(fake.path, "run", "--", "ls")
    assert "sandbox" not in _sent(fake, "session.create")[1]
    proc = await dsh(fake.path, "run", "--session", "s1", "--policy", "ask", "--", "ls")
    assert proc.returncode == 2 and "dsh policy SESSION" in proc.stderr.decode()
    proc = await dsh(fake.path, "run", "--sandbox", "sideways", "--", "ls")
    assert proc.returncode == 2


async def test_policy_command(fake):
    proc = await dsh(fake.path, "policy", "s1", "never")
    assert (proc.returncode, proc.stdout) == (0, b"")
    assert proc.stderr.decode() == "session s1: approval policy never\n"
    assert fake.policy == "never"
    proc = await dsh(fake.path, "--json", "policy", "s1", "ask")
    assert json.loads(proc.stdout) == {"sessionId": "s1", "approvalPolicy": "ask"}
    proc = await dsh(fake.path, "policy", "s1", "sometimes")
    assert proc.returncode == 2
    proc = await dsh(fake.path, "policy", "missing", "ask")
    assert proc.returncode == 1


async def test_dshd_hanging_up_is_one_line_not_a_traceback(fake, tmp_path):
    fake.call_hold = True
    run = await Live(tmp_path, "run").start(fake.path, "run", "--", "sleep 100")
    try:
        with trio.fail_after(10):
            while "tool.wait" not in [m for m, _ in fake.requests]:
                await trio.sleep(0.01)
        await fake.close_connections()
        assert await run.wait() == 75  # the call's outcome is unknown, not a failure of its own
    finally:
        run.kill()
    lines = run.err.splitlines()
    assert lines[-2] == "dsh: dshd closed the connection"
    assert lines[-1].startswith("dsh: after restarting dshd, `dsh wait s1 ")
    assert "Traceback" not in run.err


async def test_attach_approve_shows_the_sandbox_mode_the_call_runs_under(fake):
    # SessionInfo says read-only; the lane (as dshd has published it) says the config default.
    fake.infos["s1"] = {"sessionId": "s1", "lastSeq": -1, "sandbox": "read-only"}
    aid = fake.pending_ask("k8", "cat /etc/passwd")
    proc = await dsh(fake.path, "attach", "--approve", "s1", stdin=b"n\n")
    assert proc.returncode == 0
    assert (f"── approval {aid}: call k8 in session s1 asks to run bash, sandbox read-only "
            "(provider bwrap):") in proc.stderr.decode()


async def test_run_ask_interrupted_while_waiting_says_it_still_waits(fake, tmp_path):
    fake.assume_answerer = True
    run = await Live(tmp_path, "run").start(fake.path, "run", "--ask", "--", "make")
    try:
        await run.until("dsh approve s1 a-1")
        run.proc.send_signal(signal.SIGINT)
        assert await run.wait() == 130
    finally:
        run.kill()
    assert ("detached; the call still waits for approval a-1 (`dsh approve s1 a-1`). "
            "Re-attach: dsh attach s1") in run.err
    assert "a-1" not in fake.decisions  # still pending: detaching decides nothing
