"""``dsh chat`` on a real terminal (tmux): Ctrl-C cancels the turn, a second Ctrl-C while it
cancels leaves at once, the detach keys leave it running and ``dsh chat --attach`` re-joins
it (issue 15). A real dshd with the scripted provider."""

from __future__ import annotations

import json
import re

import pytest

from tests.agent.test_agent_chat_turns import FINAL, events, gated, root, scripted  # noqa: F401
from tests.e2e.tmux import Pane, have_tmux

pytestmark = pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")


@pytest.fixture
def pane_in(tmp_path):
    panes = []

    def make(daemon, cwd) -> Pane:
        p = Pane(tmp_path, str(daemon.socket), cwd)
        panes.append(p)
        return p

    yield make
    for p in panes:
        p.close()


def turn_ended(daemon, sid: str) -> bool:
    return any(e["type"] == "turn/end" for e in events(daemon, sid))


def sid_on(pane: Pane) -> str:
    return pane.until(r"^session (\w+)").group(1)


def test_ctrl_c_once_cancels_the_turn(root, workdir, pane_in):
    gate = workdir / "go"
    daemon = scripted(root, gated(gate, "Waiting for the gate.", 0), {"text": FINAL})
    try:
        pane = pane_in(daemon, workdir)
        mark = pane.run("dsh chat --yes go")
        pane.until(r"^looking")
        pane.type("C-c")
        assert pane.done(mark) == 130
        sid = sid_on(pane)
        ends = [e["data"] for e in events(daemon, sid) if e["type"] == "turn/end"]
    finally:
        daemon.close()
    assert "cancelling the turn" in pane.screen() and "turn cancelled" in pane.screen()
    assert [e["reason"] for e in ends] == ["cancelled"]


def test_a_second_ctrl_c_while_it_cancels_leaves_at_once(root, workdir, pane_in):
    """The call ignores SIGTERM and the kill grace is long: the cancel takes that long; the
    second Ctrl-C ends dsh (130) while the turn is still cancelling, and it ends on its own."""
    command = "trap '' TERM INT; echo looking; sleep 120"
    daemon = scripted(root, {"text": "Stubborn.", "toolCalls": [
        {"name": "bash", "arguments": {"command": command}}]}, {"text": FINAL},
        extra="kill_grace_seconds = 30\n")
    try:
        pane = pane_in(daemon, workdir)
        mark = pane.run("dsh chat --yes go")
        pane.until(r"^looking")
        pane.type("C-c")
        pane.until(r"cancelling the turn")
        pane.type("C-c")
        assert pane.done(mark) == 130
        sid = sid_on(pane)
        still_open = not turn_ended(daemon, sid)  # within the 30 s grace
    finally:
        daemon.close()
    assert "left the turn while it cancels" in pane.screen()
    assert still_open


def test_the_detach_keys_leave_the_turn_running_and_attach_rejoins_it(root, workdir, pane_in):
    gate = workdir / "go"
    daemon = scripted(root, gated(gate, "Waiting for the gate.", 0), {"text": FINAL})
    try:
        pane = pane_in(daemon, workdir)
        mark = pane.run("dsh chat --yes go")
        pane.until(r"^looking")
        pane.type("C-p")
        pane.type("C-q")
        assert pane.done(mark) == 0
        sid = sid_on(pane)
        hint = pane.until(r"Re-join it: dsh chat --attach (\w+)")
        assert hint.group(1) == sid
        assert not turn_ended(daemon, sid)
        again = pane.run(f"dsh chat --attach {sid}")
        pane.until(r"re-joining turn")
        gate.write_text("")
        assert pane.done(again) == 0
        screen = pane.screen()
        ends = [e["data"]["reason"] for e in events(daemon, sid) if e["type"] == "turn/end"]
    finally:
        daemon.close()
    assert ends == ["completed"]
    tail = screen[screen.index("re-joining turn"):]
    assert "› go" in tail and "Waiting for the gate." in tail and "looked" in tail
    assert FINAL in tail


def test_typed_lines_and_approval_answers_on_a_terminal(root, workdir, pane_in):
    """The key-at-a-time mode keeps lines editable: a prompt typed with a Backspace, the
    approval answered y; Ctrl-D at the prompt ends the chat."""
    daemon = scripted(root, {"text": "Writing.", "toolCalls": [
        {"name": "bash", "arguments": {"command": "echo hi > typed.txt"}}]}, {"text": FINAL})
    try:
        pane = pane_in(daemon, workdir)
        mark = pane.run("dsh chat")
        pane.until(r"^›")  # (capture-pane drops the trailing space)
        pane.type("mkae", literal=True)
        pane.type("BSpace", "BSpace", "BSpace")
        pane.type("ake it", literal=True)
        pane.type("Enter")
        pane.until(r"run it\? \[y/N\]")
        pane.type("y", literal=True)
        pane.type("Enter")
        pane.until(re.escape(FINAL) + r"\s*\n›")  # the next prompt
        pane.type("C-d")
        assert pane.done(mark) == 0
        sid = sid_on(pane)
        log = events(daemon, sid)
    finally:
        daemon.close()
    (user,) = [e["data"]["text"] for e in log if e["type"] == "message/user"]
    assert user == "make it"
    assert (workdir / "typed.txt").read_text() == "hi\n"
    assert json.dumps([e["data"].get("outcome") for e in log
                       if e["type"] == "approval/decided"]) == '["allowed-once"]'
