"""Re-joinable turns through the real CLI against a real dshd (scripted provider; issue 15):
``dsh chat --attach`` after the chat client was killed mid-turn, ``dsh steer``, a chat with
no one to ask, ``--sandbox/--policy/--name`` and ``--json``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.agent.helpers import WAIT_S, DaemonProcess

FIRST = ("First I look around the workspace, one word at a time, so that a client killed "
         "now has seen only part of this sentence.")
FINAL = "All done here: the gate opened."


@pytest.fixture
def root():
    r = Path(tempfile.mkdtemp(prefix="dsh-agt-", dir="/tmp"))
    yield r
    shutil.rmtree(r, ignore_errors=True)


def scripted(root: Path, *responses: dict, extra: str = "") -> DaemonProcess:
    script = root / "script.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in responses))
    daemon = DaemonProcess(root, f'{extra}[model]\nprovider = "scripted"\nscript = "{script}"\n')
    daemon.start()
    return daemon


def gated(gate: Path, text: str = FIRST, pace: int = 40) -> dict:
    """A step that streams ``text`` (paced) and proposes a call that waits for ``gate``."""
    return {"text": text, "paceMs": pace, "toolCalls": [{"name": "bash", "arguments": {
        "command": f"echo looking; while [ ! -f {gate} ]; do sleep 0.05; done; echo looked"}}]}


def until(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {WAIT_S} s")
        time.sleep(0.05)


def spawn(daemon: DaemonProcess, out: Path, err: Path, *args: str, cwd=None,
          stdin=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "client.cli", *args], env=daemon.env,
                            cwd=cwd, stdin=stdin, stdout=out.open("wb"), stderr=err.open("wb"))


def session_of(err: Path) -> str:
    found = until(lambda: re.search(r"^session (\w+)", err.read_text(), re.M), "session line")
    return found.group(1)


def made_session(daemon: DaemonProcess, workdir: Path) -> str:
    """A session of ``workdir`` made by ``dsh run -- true``; its id."""
    assert daemon.dsh("run", "--", "true", cwd=str(workdir)).returncode == 0
    (s,) = json.loads(daemon.dsh("sessions", "--json").stdout)
    return s["sessionId"]


def events(daemon: DaemonProcess, sid: str) -> list[dict]:
    r = daemon.dsh("log", "--json", sid)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def test_attach_after_the_chat_client_was_killed_shows_the_turn_so_far_then_live(root, workdir):
    """The chat client is SIGKILLed while the first step's text streams; the turn runs on in
    dshd; ``dsh chat --attach`` (no SESSION: the newest of this directory) prints the input,
    the whole text once, the call's output so far, then the rest live, and exits 0."""
    gate = workdir / "go"
    daemon = scripted(root, gated(gate), {"text": FINAL})
    try:
        # An answerer of its own (stdin: y), so the call is allowed with the chat gone.
        sid = made_session(daemon, workdir)
        answerer = subprocess.Popen(
            [sys.executable, "-m", "client.cli", "attach", "--approve", "--follow", sid],
            env=daemon.env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=(root / "ans.err").open("wb"))
        answerer.stdin.write(b"y\n")
        answerer.stdin.flush()
        out, err = root / "c.out", root / "c.err"
        proc = spawn(daemon, out, err, "chat", "--session", sid, "look around",
                     cwd=str(workdir))
        until(lambda: out.read_text().startswith("First I"), "the first words")
        proc.kill()
        proc.wait(WAIT_S)
        assert FIRST not in out.read_text()  # killed mid-text
        aout, aerr = root / "a.out", root / "a.err"
        att = spawn(daemon, aout, aerr, "chat", "--attach", cwd=str(workdir))
        until(lambda: "looking\n" in aout.read_text(), "the running call's output so far")
        assert att.poll() is None  # still following: the call waits for the gate
        gate.write_text("")
        assert att.wait(WAIT_S) == 0, aerr.read_text()
        shown, notes = aout.read_text(), aerr.read_text()
        answerer.kill()
        answerer.wait(WAIT_S)
    finally:
        daemon.close()
    assert f"using session {sid}" in notes and "› look around" in notes
    assert shown.count(FIRST) == 1 and shown.count("looking\n") == 1
    assert shown.index(FIRST) < shown.index("looking\n") < shown.index("looked\n") \
        < shown.index(FINAL)
    assert "── bash: echo looking;" in notes and "── exit 0" in notes


def test_attach_after_the_calls_settled_replays_them_from_the_log(root, workdir):
    """Re-joining a turn whose first step ended: its text and its call's result come from the
    log, in order; the turn waits in its second step's call; the steered text reaches the log."""
    gate1, gate2 = workdir / "go1", workdir / "go2"
    daemon = scripted(root, gated(gate1, "Step one.", 0), gated(gate2, "Step two.", 0),
                      {"text": FINAL})
    try:
        out, err = root / "c.out", root / "c.err"
        proc = spawn(daemon, out, err, "chat", "--yes", "two steps", cwd=str(workdir))
        sid = session_of(err)
        until(lambda: "looking" in out.read_text(), "the first call")
        gate1.write_text("")
        until(lambda: "Step two." in out.read_text(), "the second step")
        # Its call runs (the chat allowed it) before the chat dies: killed earlier, the call
        # would wait for an answerer (turn_ask_grace_seconds) that the re-join below is not.
        until(lambda: out.read_text().count("looking") == 2, "the second call running")
        proc.kill()
        proc.wait(WAIT_S)
        r = daemon.dsh("steer", "--json", sid, "also say hi")
        assert r.returncode == 0, r.stderr
        steered = json.loads(r.stdout)  # --json: the answer on stdout, not the note
        assert steered["sessionId"] == sid and steered["turnId"].startswith("t-")
        assert steered["queued"] is True and "queued for turn" not in r.stderr
        aout, aerr = root / "a.out", root / "a.err"
        att = spawn(daemon, aout, aerr, "chat", "--attach", sid, cwd=str(workdir))
        until(lambda: aout.read_text().count("looking") == 2, "both calls' output")
        gate2.write_text("")
        assert att.wait(WAIT_S) == 0, aerr.read_text()
        shown, notes = aout.read_text(), aerr.read_text()
        log = events(daemon, sid)
        nosteer = daemon.dsh("steer", sid, "too late")
    finally:
        daemon.close()
    assert shown.index("Step one.") < shown.index("looked") < shown.index("Step two.") \
        < shown.index(FINAL)
    assert notes.count("── exit 0") == 2
    steers = [e for e in log if e["type"] == "message/user" and e["data"].get("steer")]
    assert [e["data"]["text"] for e in steers] == ["also say hi"]
    assert nosteer.returncode == 1
    assert f"no turn is running in session {sid}: nothing to steer" in nosteer.stderr


def test_attach_with_no_turn_running_says_so(root, workdir):
    daemon = scripted(root, {"text": "Hi."})
    try:
        r = daemon.dsh("chat", "--yes", "hello", cwd=str(workdir))
        assert r.returncode == 0, r.stderr
        sid = re.search(r"^session (\w+)", r.stderr, re.M).group(1)
        again = daemon.dsh("chat", "--attach", sid, cwd=str(workdir))
    finally:
        daemon.close()
    assert again.returncode == 0, again.stderr
    assert f"no turn is running in session {sid}" in again.stderr


def test_no_terminal_and_no_yes_says_no_one_could_be_asked(root, workdir):
    """stdin at end of file, no --yes: the call is not "rejected by the person approving it";
    dsh says no one could be asked, dshd records ``unavailable`` (not ``rejected``), the model
    is told, the command never ran, and dsh exits 125."""
    daemon = scripted(root, {"text": "Making it.", "toolCalls": [
        {"name": "bash", "arguments": {"command": "touch made.txt"}}]}, {"text": "Could not."})
    try:
        r = daemon.dsh("chat", "make a file", cwd=str(workdir))
        sid = re.search(r"^session (\w+)", r.stderr, re.M).group(1)
        log = events(daemon, sid)
    finally:
        daemon.close()
    assert r.returncode == 125, r.stderr
    assert "no one could be asked" in r.stderr and "pass --yes" in r.stderr.lower()
    assert "rejected by the person" not in r.stderr
    assert not (workdir / "made.txt").exists()
    decided = [e["data"] for e in log if e["type"] == "approval/decided"]
    assert [d["outcome"] for d in decided] == ["unavailable"]
    assert "Could not." in r.stdout


def test_new_session_options_and_json_lines(root, workdir):
    """--sandbox/--policy/--name set up the new session; --json prints the turn's events,
    turn/start first, turn/end last, one JSON object a line (no assistant text as prose)."""
    daemon = scripted(root, {"text": "Hi there."})
    try:
        r = daemon.dsh("chat", "--json", "--sandbox", "read-only", "--policy", "never",
                       "--name", "planner", "hello", cwd=str(workdir))
        listed = json.loads(daemon.dsh("sessions", "--json").stdout)
        bad = daemon.dsh("chat", "--session", "planner", "--sandbox", "read-only", "x")
    finally:
        daemon.close()
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines[0]["type"] == "turn/start" and lines[-1]["type"] == "turn/end"
    assert lines[-1]["data"]["reason"] == "completed"
    assert any(e["type"] == "message/assistant" and e["data"]["text"] == "Hi there."
               for e in lines)
    sessions = listed if isinstance(listed, list) else listed["sessions"]
    (s,) = sessions
    assert s["name"] == "planner" and s["approvalPolicy"] == "never"
    assert "read-only" in json.dumps(s["sandbox"])
    assert bad.returncode == 2 and "set up a new session" in bad.stderr


def test_chat_in_a_session_with_a_running_turn_points_at_attach(root, workdir):
    gate = workdir / "go"
    daemon = scripted(root, gated(gate, "Waiting.", 0), {"text": FINAL})
    try:
        out, err = root / "c.out", root / "c.err"
        proc = spawn(daemon, out, err, "chat", "--yes", "wait", cwd=str(workdir))
        sid = session_of(err)
        until(lambda: "looking" in out.read_text(), "the call")
        second = daemon.dsh("chat", "--session", sid, "another", cwd=str(workdir))
        gate.write_text("")
        assert proc.wait(WAIT_S) == 0
    finally:
        daemon.close()
    assert second.returncode == 1
    assert f"dsh chat --attach {sid}" in second.stderr


def test_dsh_attach_shows_a_running_turns_text_and_calls(root, workdir):
    """`dsh attach SESSION` while a turn runs: the step's assistant text (not only the call's
    output), then live to the turn's end; the turn's status."""
    gate = workdir / "go"
    daemon = scripted(root, gated(gate, "Step text the attach must show.", 0), {"text": FINAL})
    try:
        out, err = root / "c.out", root / "c.err"
        proc = spawn(daemon, out, err, "chat", "--yes", "go", cwd=str(workdir))
        sid = session_of(err)
        until(lambda: "looking" in out.read_text(), "the call")
        aout, aerr = root / "a.out", root / "a.err"
        att = spawn(daemon, aout, aerr, "attach", sid, cwd=str(workdir))
        until(lambda: "looking" in aout.read_text(), "the call's output in attach")
        gate.write_text("")
        assert att.wait(WAIT_S) == 0, aerr.read_text()
        assert proc.wait(WAIT_S) == 0
        shown = aout.read_text()
    finally:
        daemon.close()
    assert shown.index("Step text the attach must show.") < shown.index("looked") \
        < shown.index(FINAL)
