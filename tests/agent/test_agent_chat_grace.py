"""A turn's call outlives its chat (issue 15, PROTOCOL.md §3.4's one rule): a model call's
approval with no answerer waits ``turn_ask_grace_seconds`` for one to (re)join -- from the ask
when the chat died before it, from the moment the last answerer left when it died while the
call was asked. ``dsh chat --attach --yes`` within the grace answers it and the turn completes;
past the grace it is ``unavailable``. And with no terminal, piped lines are prompts, never
approval answers. Real dshd (scripted provider), real CLI, tmux for the terminal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.agent.helpers import WAIT_S
from tests.agent.test_agent_chat_turns import (FINAL, events, made_session, root,  # noqa: F401
                                               scripted, session_of, spawn, until)
from tests.e2e.tmux import Pane, have_tmux

needs_tmux = pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")

COUNT = "echo ran >> ran.txt"


def asking(text: str = "Counting.", pace: int = 0) -> dict:
    """A step that proposes one call whose every run appends a line to ran.txt."""
    return {"text": text, "paceMs": pace, "toolCalls": [
        {"name": "bash", "arguments": {"command": COUNT}}]}


def grace(seconds: float) -> str:
    return f"turn_ask_grace_seconds = {seconds}\n"


def decided(daemon, sid: str) -> list[dict]:
    return [e["data"] for e in events(daemon, sid) if e["type"] == "approval/decided"]


def turn_ends(daemon, sid: str) -> list[str]:
    return [e["data"]["reason"] for e in events(daemon, sid) if e["type"] == "turn/end"]


def runs(workdir) -> int:
    ran = workdir / "ran.txt"
    return len(ran.read_text().splitlines()) if ran.exists() else 0


def chat_killed_while_asked(daemon, workdir, tmp_path) -> tuple[str, Pane]:
    """``dsh chat`` on a terminal asks y/N; it is SIGKILLed while the call waits; its sid."""
    pane = Pane(tmp_path, str(daemon.socket), workdir)
    pidfile = tmp_path / "chat.pid"
    pane.run(f"sh -c 'echo $$ > {pidfile}; exec dsh chat --name ch4 look around'")
    pane.until(r"run it\? \[y/N\]")
    # The shell's "# " prompt may land before the line when it was late (a loaded machine).
    sid = pane.until(r"^(?:[#$] )?session (\w+)").group(1)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    pane.until(r"^DONE1-")
    return sid, pane


@needs_tmux
def test_a_chat_killed_while_asked_rejoins_with_yes_and_the_call_runs_once(root, workdir,
                                                                         tmp_path):
    daemon = scripted(root, asking(), {"text": FINAL}, extra=grace(60))
    pane = None
    try:
        sid, pane = chat_killed_while_asked(daemon, workdir, tmp_path)
        assert decided(daemon, sid) == []  # the last answerer left: the grace runs
        again = daemon.dsh("chat", "--attach", "ch4", "--yes", cwd=str(workdir))
        log_decided, ends = decided(daemon, sid), turn_ends(daemon, sid)
    finally:
        if pane is not None:
            pane.close()
        daemon.close()
    assert again.returncode == 0, again.stderr
    assert "re-joining turn" in again.stderr and FINAL in again.stdout
    assert [(d["outcome"], d["by"]) for d in log_decided] == [("allowed-once", "answerer")]
    assert ends == ["completed"]
    assert runs(workdir) == 1


@needs_tmux
def test_past_the_grace_a_call_whose_chat_was_killed_is_unavailable(root, workdir, tmp_path):
    daemon = scripted(root, asking(), {"text": "Could not."}, extra=grace(1))
    pane = None
    try:
        sid, pane = chat_killed_while_asked(daemon, workdir, tmp_path)
        until(lambda: turn_ends(daemon, sid), "the turn's end after the grace")
        log_decided, ends = decided(daemon, sid), turn_ends(daemon, sid)
        late = daemon.dsh("chat", "--attach", sid, "--yes", cwd=str(workdir))
        results = [e["data"] for e in events(daemon, sid) if e["type"] == "tool/result"]
    finally:
        if pane is not None:
            pane.close()
        daemon.close()
    assert [(d["outcome"], d["by"]) for d in log_decided] == [("unavailable", "policy")]
    assert ends == ["completed"] and runs(workdir) == 0
    assert [r.get("errorCode") for r in results] == ["APPROVAL_UNAVAILABLE"], results
    assert "turn_ask_grace_seconds" in results[0].get("message", "") + str(results[0])
    assert late.returncode == 0 and f"no turn is running in session {sid}" in late.stderr


def test_a_chat_killed_before_the_ask_rejoins_with_yes_and_the_call_runs_once(root, workdir):
    """The tester's case: ``dsh chat --yes`` dies while the step's text streams, so nobody is
    attached when the call is asked; the call waits; ``--attach --yes`` answers it."""
    daemon = scripted(root, asking("Looking around the workspace, slowly, one word at a "
                                   "time, before I count.", 150), {"text": FINAL},
                      extra=grace(60))
    try:
        out, err = root / "c.out", root / "c.err"
        proc = spawn(daemon, out, err, "chat", "--name", "ch4", "--yes", "look around",
                     cwd=str(workdir))
        sid = session_of(err)
        until(lambda: out.read_text().startswith("Looking"), "the first words")
        proc.kill()
        proc.wait(WAIT_S)
        until(lambda: any(e["type"] == "approval/asked" for e in events(daemon, sid)),
              "the ask")
        assert decided(daemon, sid) == []
        again = daemon.dsh("chat", "--attach", "ch4", "--yes", cwd=str(workdir))
        log_decided, ends = decided(daemon, sid), turn_ends(daemon, sid)
    finally:
        daemon.close()
    assert again.returncode == 0, again.stderr
    assert [(d["outcome"], d["by"]) for d in log_decided] == [("allowed-once", "answerer")]
    assert ends == ["completed"] and runs(workdir) == 1


def test_piped_prompts_are_never_taken_as_approval_answers(root, workdir):
    """``printf 'first\\nsecond\\n' | dsh chat --session S``: two turns; the first's call is
    unavailable (nobody can be asked without a terminal or --yes), not rejected by "second";
    exit 125."""
    daemon = scripted(root, asking("Making it."), {"text": "Could not."},
                      {"text": "Second answer."})
    try:
        sid = made_session(daemon, workdir)
        r = subprocess.run([sys.executable, "-m", "client.cli", "chat", "--session", sid],
                           env=daemon.env, cwd=str(workdir), input="first\nsecond\n",
                           capture_output=True, text=True, timeout=WAIT_S)
        log = events(daemon, sid)
    finally:
        daemon.close()
    inputs = [e["data"]["text"] for e in log
              if e["type"] == "message/user" and not e["data"].get("steer")]
    assert inputs == ["first", "second"], r.stderr
    assert [(e["data"]["outcome"], e["data"]["by"]) for e in log
            if e["type"] == "approval/decided" and e["data"]["by"] != "caller"] \
        == [("unavailable", "policy")]  # (the caller's: made_session's dsh run)
    assert "Second answer." in r.stdout and runs(workdir) == 0
    assert r.returncode == 125, r.stderr
    assert "no one could be asked" in r.stderr
    assert not re.search(r"run it\? \[y/N\]", r.stdout + r.stderr)
