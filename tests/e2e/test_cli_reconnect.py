"""``dsh run``, ``dsh attach`` and ``dsh wait`` ride through a daemon restart (issue 13 item 4):
a real dshd (``dshd.testing.DshdProcess``, real bwrap) stopped with SIGTERM or killed with
SIGKILL under a live ``dsh``, then started again. The output is printed exactly once, in
order, the exit status is the command's; exit 75 only when dshd does not come back within
``--reconnect-timeout`` or the call's outcome is really unknown (its host died too)."""

from __future__ import annotations

import json
import re
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import zstandard

from tests.e2e.conftest import DaemonProcess
from tests.e2e.tmux import Pane, have_tmux

CONFIG = 'sandbox_provider = "bwrap"\n'
LOST = "dsh: lost dshd; reconnecting (up to "


def loop(n: int, *, marks: bool = True, code: int = 7) -> str:
    """A command that prints 1..n, one a second (and appends each to ``marks``)."""
    append = " echo $i >> marks;" if marks else ""
    return f"for i in $(seq 1 {n}); do echo $i;{append} sleep 1; done; exit {code}"


@pytest.fixture
def dshd():
    root = Path(tempfile.mkdtemp(prefix="dsh-rc-"))
    (root / "dshd.toml").write_text(CONFIG)
    d = DaemonProcess(root, ["--config", str(root / "dshd.toml")])
    d.start()
    try:
        yield d
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def work(tmp_path):
    w = tmp_path / "work"
    w.mkdir()
    return w


class Dsh:
    """A ``dsh`` subprocess whose stdout and stderr go to files (read them any time)."""

    def __init__(self, d: DaemonProcess, tmp: Path, name: str, *args: str, cwd: Path,
                 stdin: int = subprocess.DEVNULL) -> None:
        self.out_path, self.err_path = tmp / f"{name}.out", tmp / f"{name}.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "client.cli", *args],
                                         env=d.env, cwd=cwd, stdout=out, stderr=err,
                                         stdin=stdin)

    @property
    def out(self) -> str:
        return self.out_path.read_text()

    @property
    def err(self) -> str:
        return self.err_path.read_text()

    def until_out(self, text: str, timeout: float = 60) -> None:
        self._until(lambda: text in self.out, f"stdout to show {text!r}", timeout)

    def until_err(self, text: str, timeout: float = 60) -> None:
        self._until(lambda: text in self.err, f"stderr to show {text!r}", timeout)

    def _until(self, check, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None and not check():
                raise AssertionError(f"dsh exited {self.proc.returncode} before {what}:\n"
                                     f"{self.err}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout} s:\n{self.err}")
            time.sleep(0.05)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"dsh did not end within {timeout} s:\n{self.err}") from None

    def ids(self) -> tuple[str, str]:
        self.until_err("session ")
        words = self.err.splitlines()[0].split()
        assert words[0] == "session" and words[2] == "call", self.err
        return words[1], words[3]


def restart(d: DaemonProcess, how: str) -> None:
    """SIGTERM (a graceful stop) or SIGKILL (a crash) of dshd, then a start."""
    if how == "term":
        d.stop()
    else:
        d.kill9()
    d.start()


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def waited(d: DaemonProcess, sid: str, cid: str, cwd: Path) -> dict:
    """``tool.wait`` from a new client (``dsh wait --json``)."""
    r = d.dsh("--json", "wait", sid, cid, cwd=str(cwd), timeout=120)
    return json.loads(r.stdout)


def until_on_disk(d: DaemonProcess, sid: str, text: str, timeout: float = 60) -> None:
    """Wait until the session's log file holds ``text`` (written out, as a crash finds it)."""
    path = d.state_dir / "sessions" / sid / "session.v1.jsonl.zst"
    deadline = time.monotonic() + timeout
    while text not in on_disk(path):
        assert time.monotonic() < deadline, f"{text} never reached {path}"
        time.sleep(0.1)


def on_disk(path: Path) -> str:
    """What of a zstd log can be read now (a frame still being written ends the text)."""
    out = bytearray()
    with path.open("rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        try:
            while chunk := reader.read(65536):
                out += chunk
        except zstandard.ZstdError:
            pass
    return out.decode(errors="replace")


def until_connections(d: DaemonProcess, count: int, cwd: Path, timeout: float = 60) -> None:
    """Wait until dshd serves ``count`` connections (``dsh status``'s own among them)."""
    deadline = time.monotonic() + timeout
    while True:
        status = json.loads(d.dsh("--json", "status", cwd=str(cwd)).stdout)
        if status["connections"] >= count:
            return
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


# ---------------------------------------------------------------------- the daemon stays away
def test_run_exits_75_when_dshd_does_not_come_back(dshd, work, tmp_path):
    run = Dsh(dshd, tmp_path, "run", "run", "--reconnect-timeout", "3", "--", "sh", "-c",
              loop(60, marks=False), cwd=work)
    sid, cid = run.ids()
    run.until_out("2\n")
    dshd.kill9()
    lost_at = time.monotonic()
    assert run.wait() == 75
    waited_for = time.monotonic() - lost_at
    err = run.err
    assert err.count(LOST + "3 s)") == 1, err
    assert "dsh: dshd did not come back within 3 s (--reconnect-timeout" in err, err
    assert f"`dsh wait {sid} {cid}` shows what became of the call" in err, err
    assert waited_for >= 2.5, f"gave up after {waited_for:.1f} s, before the timeout"
    printed = lines_of(run.out)
    assert printed == [str(i) for i in range(1, len(printed) + 1)], run.out


def test_reconnect_timeout_zero_keeps_the_old_end(dshd, work, tmp_path):
    run = Dsh(dshd, tmp_path, "run", "run", "--reconnect-timeout", "0", "--", "sh", "-c",
              loop(60, marks=False), cwd=work)
    sid, cid = run.ids()
    run.until_out("1\n")
    dshd.kill9()
    assert run.wait(30) == 75
    assert LOST not in run.err, run.err
    assert "connection to dshd lost" in run.err or "dshd closed the connection" in run.err, \
        run.err
    assert f"`dsh wait {sid} {cid}`" in run.err, run.err


# ---------------------------------------------------------------------- unknown outcome
def host_pid(d: DaemonProcess, sid: str, cid: str) -> int:
    record = json.loads((d.state_dir / "sessions" / sid / "calls" / cid / "host.json").read_text())
    return int(record["pid"])


def test_run_exits_75_when_the_host_died_with_dshd(dshd, work, tmp_path):
    """dshd and the call host both killed: dsh comes back, prints the rest of what the log
    holds (from its offset: no line twice) and ends with TOOL_OUTCOME_UNKNOWN's 75."""
    run = Dsh(dshd, tmp_path, "run", "run", "--", "sh", "-c", loop(60), cwd=work)
    sid, cid = run.ids()
    run.until_out("3\n")
    host = host_pid(dshd, sid, cid)
    dshd.kill9()
    os.kill(host, signal.SIGKILL)
    dshd.start()
    assert run.wait() == 75
    err = run.err
    assert err.count(LOST) == 1 and "dsh: dshd is back; following call" in err, err
    assert "TOOL_OUTCOME_UNKNOWN" in err, err
    printed = lines_of(run.out)
    assert printed == [str(i) for i in range(1, len(printed) + 1)], run.out
    replayed = dshd.dsh("wait", sid, cid, cwd=str(work), timeout=60)
    assert replayed.returncode == 75 and replayed.stdout == run.out, (replayed.stdout, run.out)


# ---------------------------------------------------------------------- the call survives
def numbers(n: int) -> list[str]:
    return [str(i) for i in range(1, n + 1)]


def test_run_rides_through_a_graceful_restart_and_a_crash(dshd, work, tmp_path):
    """The issue's must-show: SIGTERM + start at ~5 s, kill -9 + start at ~15 s under one
    ``dsh run`` of a 30 s loop: 1..30 printed once each, in order; exit 7; ``tool.wait`` from
    a new client gives exit 7; the file the command appends to has 30 lines."""
    run = Dsh(dshd, tmp_path, "run", "run", "--", "sh", "-c", loop(30), cwd=work)
    sid, cid = run.ids()
    run.until_out("5\n")
    restart(dshd, "term")
    run.until_err("dsh: dshd is back")
    run.until_out("15\n")
    restart(dshd, "kill")
    assert run.wait() == 7, run.err
    assert lines_of(run.out) == numbers(30), run.out
    err = run.err
    # Two outages, one line each way (the second's budget may be what is left of the first's
    # when it starts within 5 s of the first reconnect: a loaded machine restarts slowly).
    assert err.count(LOST) == 2 and err.count("dsh: dshd is back") == 2, err
    assert "TOOL_OUTCOME_UNKNOWN" not in err, err
    result = waited(dshd, sid, cid, work)
    assert result["exitCode"] == 7 and result.get("errorCode") is None, result
    status = json.loads(dshd.dsh("--json", "status", cwd=str(work)).stdout)
    assert status["sandbox"]["provider"] == "bwrap", status  # the call ran confined by bwrap
    assert lines_of((work / "marks").read_text()) == numbers(30)


@pytest.mark.parametrize("how", ["term", "kill"])
def test_attach_rides_through_a_restart(dshd, work, tmp_path, how):
    run = Dsh(dshd, tmp_path, "run", "run", "--", "sh", "-c", loop(8), cwd=work)
    sid, cid = run.ids()
    run.until_out("1\n")
    run.proc.send_signal(signal.SIGTERM)  # dsh detaches; the call runs on
    assert run.wait() == 143
    attach = Dsh(dshd, tmp_path, "attach", "attach", sid, "--call", cid, cwd=work)
    attach.until_out("2\n")
    restart(dshd, how)
    assert attach.wait() == 7, attach.err
    assert lines_of(attach.out) == numbers(8), attach.out
    assert attach.err.count(LOST) == 1 and "dsh: dshd is back" in attach.err, attach.err
    assert lines_of((work / "marks").read_text()) == numbers(8)


@pytest.mark.parametrize("how", ["term", "kill"])
def test_wait_rides_through_a_restart(dshd, work, tmp_path, how):
    # The command waits for a gate opened after the restart: dsh wait's tool.wait is in flight
    # across it however slowly a loaded machine gets there.
    gated = ("echo 1; echo 2; echo 3; while [ ! -e go ]; do sleep 0.1; done; "
             "echo 4; echo 5; echo 6; exit 7")
    run = Dsh(dshd, tmp_path, "run", "run", "--", "sh", "-c", gated, cwd=work)
    sid, cid = run.ids()
    run.until_out("1\n")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 143
    wait = Dsh(dshd, tmp_path, "wait", "wait", sid, cid, cwd=work)
    until_connections(dshd, 2, work)  # dsh wait's and our own: its tool.wait is in flight
    restart(dshd, how)
    (work / "go").touch()
    assert wait.wait() == 7, wait.err
    assert lines_of(wait.out) == numbers(6), wait.out
    assert wait.err.count(LOST) == 1 and "dsh: reconnected to dshd" in wait.err, wait.err


def test_run_forwards_stdin_across_a_restart(dshd, work, tmp_path):
    """Piped stdin goes on reaching the command after the restart (a new connection's
    ``tool.write``s), and its end closes the command's stdin."""
    feeder_r, feeder_w = os.pipe()
    out, err = tmp_path / "in.out", tmp_path / "in.err"
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "client.cli", "run", "--", "sh", "-c",
                                 "while read line; do echo got $line; done; echo eof; exit 3"],
                                env=dshd.env, cwd=work, stdin=feeder_r, stdout=fo, stderr=fe)
    os.close(feeder_r)
    try:
        os.write(feeder_w, b"one\n")
        deadline = time.monotonic() + 60
        while "got one" not in out.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
            time.sleep(0.05)
        restart(dshd, "term")
        while "dsh: dshd is back" not in err.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
            time.sleep(0.05)
        os.write(feeder_w, b"two\n")
    finally:
        os.close(feeder_w)
    assert proc.wait(60) == 3, err.read_text()
    assert out.read_text() == "got one\ngot two\neof\n", (out.read_text(), err.read_text())


# ---------------------------------------------------------------------- a tty call
@pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")
def test_a_tty_call_gets_keys_and_size_again_after_a_restart(dshd, work, tmp_path):
    """``dsh run -t`` in a real terminal: after the restart the keys reach the command again
    and a resize made while dshd was away reaches its terminal; the terminal stays raw."""
    pane = Pane(tmp_path, str(dshd.socket), work)
    try:
        mark = pane.run("dsh run -t -- sh -c 'while read line; do echo \"size: $(stty size) "
                        "$line\"; done; exit 4'")
        pane.until(r"session \S+ call \S+")
        pane.line("a")
        pane.until(r"size: 40 120 a")
        dshd.stop()
        pane.until(r"dsh: lost dshd; reconnecting")
        pane.resize(100, 30)
        dshd.start()
        pane.until(r"dsh: dshd is back")
        pane.line("b")
        pane.until(r"size: 30 100 b")
        pane.type("C-d")  # the PTY's end of input: raw mode still sends it to the command
        assert pane.done(mark) == 4
    finally:
        pane.close()


# ---------------------------------------------------------------------- an approval pending
@pytest.mark.parametrize("how,answer", [("term", "y"), ("kill", "y"), ("term", "n")])
def test_an_approval_pending_across_a_restart_is_answered_after_it(dshd, work, tmp_path, how,
                                                                   answer):
    """``dsh attach --approve`` and ``dsh run --ask`` both ride through the restart: the
    answerer shows the request again (same approvalId), y runs the command once, n never."""
    first = dshd.dsh("run", "--", "true", cwd=str(work))
    sid = first.stderr.split()[1]
    answerer = Dsh(dshd, tmp_path, "answerer", "attach", "--approve", "--follow", sid,
                   cwd=work, stdin=subprocess.PIPE)
    until_connections(dshd, 2, work)  # the answerer is attached before the call is asked
    run = Dsh(dshd, tmp_path, "run", "run", "--ask", "--session", sid, "--", "sh", "-c",
              "echo ran >> marker; echo done", cwd=work)
    run.until_err("waits for approval ")
    approval_id = run.err.split("waits for approval ", 1)[1].split(":", 1)[0]
    answerer.until_err(f"approval {approval_id}: call")
    until_on_disk(dshd, sid, f'"approvalId":"{approval_id}"')  # a crash keeps the request
    restart(dshd, how)
    run.until_err("dsh: dshd is back")
    answerer.until_err("dsh: reconnected to dshd")
    deadline = time.monotonic() + 60
    while answerer.err.count(f"approval {approval_id}: call") < 2:  # shown again, same id
        assert time.monotonic() < deadline and answerer.proc.poll() is None, answerer.err
        time.sleep(0.05)
    answerer.proc.stdin.write(f"{answer}\n".encode())
    answerer.proc.stdin.flush()
    try:
        status = run.wait()
    finally:
        answerer.proc.stdin.close()
        answerer.proc.terminate()
        answerer.wait()
    marker = work / "marker"
    if answer == "y":
        assert status == 0 and run.out == "done\n", run.err
        assert marker.read_text() == "ran\n"
    else:
        assert status == 125 and "APPROVAL_REJECTED" in run.err, run.err
        assert not marker.exists()


def test_attach_follow_of_a_session_rides_through_a_restart(dshd, work, tmp_path):
    """``dsh attach --follow SESSION`` (the lane view, every call): subscribed again on the
    new connection with what it had shown, the call's output goes on without a line twice and
    its footer comes once it ended."""
    run = Dsh(dshd, tmp_path, "run", "run", "--", "sh", "-c", loop(8), cwd=work)
    sid, cid = run.ids()
    run.until_out("1\n")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 143
    attach = Dsh(dshd, tmp_path, "attach", "attach", "--follow", sid, cwd=work)
    try:
        attach.until_out("3\n")
        restart(dshd, "term")
        attach.until_err("dsh: reconnected to dshd")
        attach.until_err(f"call {cid} exited 7")
    finally:
        attach.proc.terminate()
        attach.wait()
    assert lines_of(attach.out) == numbers(8), attach.out
    assert attach.err.count(LOST) == 1, attach.err


@pytest.mark.parametrize("command", ["wait", "attach"])
def test_wait_and_attach_exit_75_when_dshd_does_not_come_back(dshd, work, tmp_path, command):
    run = Dsh(dshd, tmp_path, "run", "run", "--", "sh", "-c", loop(60, marks=False), cwd=work)
    sid, cid = run.ids()
    run.until_out("1\n")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 143
    args = ["wait", sid, cid] if command == "wait" else ["attach", sid, "--call", cid]
    follower = Dsh(dshd, tmp_path, command, *args, "--reconnect-timeout", "2", cwd=work)
    until_connections(dshd, 2, work)
    dshd.kill9()
    assert follower.wait() == 75, follower.err
    err = follower.err
    assert err.count(LOST + "2 s)") == 1, err
    assert "dsh: dshd did not come back within 2 s (--reconnect-timeout" in err, err
    assert f"`dsh wait {sid} {cid}` shows what became of the call" in err, err


def test_approve_follow_shows_the_end_of_a_call_that_ended_while_dshd_was_down(dshd, work,
                                                                              tmp_path):
    """``dsh attach --approve --follow``: a call approved here that ends while dshd is away
    (kill -9) is shown to its end after the reconnect -- the rest of its output and its end
    line -- as plain ``--follow`` shows it (the answerer keeps what it had shown)."""
    first = dshd.dsh("run", "--", "true", cwd=str(work))
    sid = first.stderr.split()[1]
    answerer = Dsh(dshd, tmp_path, "answerer", "attach", "--approve", "--follow", sid,
                   cwd=work, stdin=subprocess.PIPE)
    try:
        until_connections(dshd, 2, work)
        run = Dsh(dshd, tmp_path, "run", "run", "--ask", "--session", sid, "--", "sh", "-c",
                  "echo approved-run; while [ ! -e go ]; do sleep 0.1; done; echo end; touch ended",
                  cwd=work)
        run.until_err("waits for approval ")
        approval_id = run.err.split("waits for approval ", 1)[1].split(":", 1)[0]
        answerer.until_err(f"approval {approval_id}: call")
        answerer.proc.stdin.write(b"y\n")
        answerer.proc.stdin.flush()
        answerer.until_out("approved-run\n")
        cid = run.ids()[1]
        dshd.kill9()
        (work / "go").touch()  # the command ends while dshd is down
        deadline = time.monotonic() + 60
        while not (work / "ended").exists():
            assert time.monotonic() < deadline, "the command did not end while dshd was down"
            time.sleep(0.05)
        dshd.start()
        answerer.until_err("dsh: reconnected to dshd")
        answerer.until_err(f"call {cid} exited 0")
        assert run.wait() == 0, run.err
    finally:
        answerer.proc.stdin.close()
        answerer.proc.terminate()
        answerer.wait()
    assert answerer.out == "approved-run\nend\n", (answerer.out, answerer.err)
    assert answerer.err.count(f"call {cid} exited 0") == 1, answerer.err


def test_a_shared_budget_is_said_with_its_real_figures(dshd, work, tmp_path):
    """A second outage less than 5 s (``STABLE_S``) after a reconnect goes on with what was
    left of the first's budget: the line that gives up says that figure and why, not the
    full --reconnect-timeout (which it did not wait for)."""
    run = Dsh(dshd, tmp_path, "run", "run", "--reconnect-timeout", "20", "--", "sh", "-c",
              loop(120, marks=False), cwd=work)
    sid, cid = run.ids()
    run.until_out("1\n")
    dshd.kill9()
    run.until_err(LOST + "20 s)")
    time.sleep(4)  # the first outage takes a part of the budget
    dshd.start()
    run.until_err("dsh: dshd is back")
    dshd.kill9()  # at once: within STABLE_S of the reconnect, so the budget is shared
    assert run.wait() == 75, run.err
    err = run.err
    second = err.split(LOST, 2)[2].split(" s)", 1)[0]
    assert second.isdigit() and int(second) < 20, err
    assert (f"dsh: dshd did not come back within {second} s (what was left of "
            "--reconnect-timeout 20 s: outages less than 5 s apart share it") in err, err
    assert f"`dsh wait {sid} {cid}` shows what became of the call" in err, err


@pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")
def test_a_tty_calls_reconnect_notices_start_on_their_own_line(dshd, work, tmp_path):
    """``dsh run -t`` of a program whose cursor is mid-line (a prompt): the notices of a
    restart start at the beginning of a line of their own, not after the program's text."""
    pane = Pane(tmp_path, str(dshd.socket), work)
    try:
        mark = pane.run("dsh run -t -- sh -c 'printf \"name> \"; read line; "
                        "echo \"hello $line\"; exit 4'")
        pane.until(r"^name>\s*$")  # capture-pane trims the trailing blank
        dshd.stop()
        pane.until(r"^dsh: lost dshd; reconnecting")
        dshd.start()
        pane.until(r"^dsh: dshd is back")
        assert not re.search(r"name> dsh: lost", pane.screen()), pane.screen()
        pane.line("b")
        pane.until(r"hello b")
        assert pane.done(mark) == 4
    finally:
        pane.close()
