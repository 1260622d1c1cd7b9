"""``dsh chat`` against a real dshd subprocess whose model is the ``scripted`` provider."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.agent.helpers import DaemonProcess


@pytest.fixture
def chat_root():
    root = Path(tempfile.mkdtemp(prefix="dsh-agc-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_chat_with_the_embedded_demo_script(chat_root, workdir):
    """No config at all: the built-in scripted model proposes `pwd && ls`, --yes allows it,
    the answer and the command's output stream to stdout."""
    (workdir / "hello.txt").write_text("hi\n")
    daemon = DaemonProcess(chat_root, "")
    daemon.start()
    try:
        r = daemon.dsh("chat", "--yes", "what is in here?", cwd=str(workdir))
    finally:
        daemon.close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Hello! I am dshd's built-in scripted model")
    assert f"{workdir}\n" in r.stdout and "hello.txt" in r.stdout  # the tool's output
    assert r.stdout.rstrip().endswith("for real answers.")
    assert "── bash: pwd && ls -la | head -n 20" in r.stderr and "── exit 0" in r.stderr


def test_piped_lines_are_one_turn_each_and_yes_allows_the_calls(chat_root, workdir):
    """No prompt: lines from stdin, one turn each. Piped lines are prompts, never approval
    answers (issue 15: answers are asked on a terminal -- test_agent_chat_tty); --yes allows
    each call."""
    script = chat_root / "script.jsonl"
    script.write_text(
        json.dumps({"text": "Writing it.", "toolCalls": [
            {"name": "bash", "arguments": {"command": "echo run >> f.txt; cat f.txt"}}]}) + "\n"
        + json.dumps({"text": "Done."}) + "\n"
    )
    daemon = DaemonProcess(chat_root, f'[model]\nprovider = "scripted"\nscript = "{script}"\n')
    daemon.start()
    try:
        r = daemon.dsh("chat", "--yes", input="first\nsecond\n", cwd=str(workdir))
        sessions = json.loads(daemon.dsh("sessions", "--json").stdout)
    finally:
        daemon.close()
    assert r.returncode == 0, r.stderr
    assert (workdir / "f.txt").read_text() == "run\nrun\n"  # one run each turn
    assert r.stdout.count("Writing it.") == 2 and r.stdout.count("Done.") == 2
    assert "run it? [y/N]" not in r.stderr and r.stderr.count("── exit 0") == 2
    assert len(sessions) == 1  # both turns in one session
