"""Shell completion (issue 15 item 6): `dsh completion bash|zsh|fish` prints click's script, and
bash completes commands, options, help topics and -- through room names' SESSION_REF -- session
names and ids, asked of a real daemon: once through click's protocol (``_DSH_COMPLETE=
bash_complete`` with COMP_WORDS / COMP_CWORD, exactly what the script runs) and once in a real
interactive bash in tmux, pressing Tab."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import click
import pytest

from client.cli.sessionref import SessionRef
from dshd.testing import DshdProcess
from tests.e2e.tmux import ROOT, Pane, have_tmux
from tests.e2e.wire import Wire
from tests.ops.helpers import DSH

#: Room names' SESSION_REF completes names and ids; until it is merged, the stub does not.
SESSION_COMPLETION = SessionRef.shell_complete is not click.ParamType.shell_complete
needs_session_ref = pytest.mark.skipif(
    not SESSION_COMPLETION, reason="room names' SESSION_REF (shell_complete) is not merged yet")


@pytest.fixture
def daemon():
    root = Path(tempfile.mkdtemp(prefix="dsh-comp-"))
    d = DshdProcess(root)
    d.start()
    try:
        yield d
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)


def _env(daemon, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMP_")}
    return dict(env, DSH_SOCKET=str(daemon.socket), **extra)


def complete(daemon, line: str) -> list[tuple[str, str]]:
    """What bash's completion function would get for the words of ``line`` (the cursor at its
    end): click's ``type,value`` lines."""
    words = line.split(" ")
    r = subprocess.run(DSH, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env=_env(daemon, _DSH_COMPLETE="bash_complete", COMP_WORDS=line,
                                COMP_CWORD=str(len(words) - 1)))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return [tuple(item.split(",", 1)) for item in r.stdout.splitlines() if item]


def test_completion_prints_clicks_script_for_each_shell_and_refuses_others(daemon):
    marks = {"bash": "complete -o nosort -F _dsh_completion dsh",
             "zsh": "#compdef dsh", "fish": "complete --no-files --command dsh"}
    for shell, mark in marks.items():
        r = subprocess.run([*DSH, "completion", shell], capture_output=True, text=True,
                           timeout=60, env=_env(daemon))
        assert r.returncode == 0 and mark in r.stdout, (shell, r.stderr)
        source = subprocess.run(DSH, capture_output=True, text=True, timeout=60,
                                env=_env(daemon, _DSH_COMPLETE=f"{shell}_source"))
        assert source.stdout == r.stdout  # the same script click would print itself
    r = subprocess.run([*DSH, "completion", "tcsh"], capture_output=True, text=True,
                       timeout=60, env=_env(daemon))
    assert r.returncode == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in r.stderr


def test_bash_completes_commands_options_and_help_topics(daemon):
    commands = {value for kind, value in complete(daemon, "dsh ")}
    assert {"run", "attach", "log", "sessions", "help", "completion"} <= commands
    assert [v for _, v in complete(daemon, "dsh se")] == ["sessions"]
    options = {value for _, value in complete(daemon, "dsh run --")}
    assert {"--timeout", "--session", "--tty", "--call-id"} <= options
    assert ("plain", "exit-codes") in complete(daemon, "dsh help ex")
    assert ("plain", "bash") in complete(daemon, "dsh completion b")


def _named_sessions(daemon, tmp_path: Path) -> dict[str, str]:
    """Two named sessions and one without a name: name (or id) -> id."""
    wire = Wire(daemon.socket)
    try:
        made = {}
        for name in ("build", "bench-7", None):
            params = {"cwd": str(tmp_path), **({"name": name} if name else {})}
            made[name or "unnamed"] = wire.result("session.create", params)["sessionId"]
        return made
    finally:
        wire.close()


@needs_session_ref
def test_bash_completes_session_names_and_ids_from_the_daemon(daemon, tmp_path):
    made = _named_sessions(daemon, tmp_path)
    offered = {value for _, value in complete(daemon, "dsh log ")}
    assert {"build", "bench-7"} <= offered and set(made.values()) <= offered
    assert {v for _, v in complete(daemon, "dsh log bu")} == {"build"}
    unnamed = made["unnamed"]
    assert {v for _, v in complete(daemon, f"dsh attach {unnamed[:6]}")} >= {unnamed}


@needs_session_ref
def test_session_completion_with_no_daemon_completes_nothing_and_never_fails(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMP_")}
    r = subprocess.run(DSH, capture_output=True, text=True, timeout=60,
                       env=dict(env, DSH_SOCKET=str(tmp_path / "none.sock"),
                                _DSH_COMPLETE="bash_complete", COMP_WORDS="dsh log ",
                                COMP_CWORD="2"))
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr == ""  # click: one "\n"


def _bash_pane(tmp_path: Path, daemon) -> Pane:
    pane = Pane(tmp_path, str(daemon.socket), tmp_path, cols=160, rows=40)
    pane.line("exec bash --norc --noprofile")
    pane.line("PS1='bash$ '; eval \"$(dsh completion bash)\"; echo READY-$?")
    pane.until(r"^READY-0")
    return pane


@pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")
def test_tab_in_a_real_bash_completes_commands_and_topics(tmp_path, daemon):
    pane = _bash_pane(tmp_path, daemon)
    try:
        pane.type("dsh comp", literal=True)
        pane.type("Tab")
        pane.type("#", literal=True)  # tmux drops trailing blanks: the mark shows the space
        pane.until(r"^bash\$ dsh completion #$")
        pane.type("C-u")
        pane.type("dsh help exit", literal=True)
        pane.type("Tab")
        pane.until(r"^bash\$ dsh help exit-codes$")
        pane.type("Enter")
        pane.until(r"^  124 +TOOL_TIMEOUT")
        pane.type("dsh s", literal=True)
        pane.type("Tab", "Tab")  # two candidates: bash lists them
        pane.until(r"sessions\s+status")
    finally:
        pane.close()


@needs_session_ref
@pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")
def test_tab_in_a_real_bash_completes_session_names(tmp_path, daemon):
    made = _named_sessions(daemon, tmp_path)
    pane = _bash_pane(tmp_path, daemon)
    try:
        pane.type("dsh log bui", literal=True)
        pane.type("Tab")
        pane.type("#", literal=True)
        pane.until(r"^bash\$ dsh log build #$")
        pane.type("C-u")
        pane.type("dsh log ", literal=True)
        pane.type("Tab", "Tab")
        pane.until(r"bench-7")
        pane.until(made["unnamed"])
    finally:
        pane.close()


def _dsh_on_path(tmp_path: Path) -> str:
    """A ``dsh`` on PATH (this checkout's), as the completion script calls it; the PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "dsh").write_text(f"#!/bin/sh\nexec {shlex.quote(DSH[0])} -m client.cli \"$@\"\n")
    (bindir / "dsh").chmod(0o755)
    return f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"


def _fish_complete(daemon, script: Path, line: str) -> list[str]:
    """fish's own completion engine (``complete -C``) on ``line``, with ``script`` loaded."""
    path = _dsh_on_path(script.parent)
    r = subprocess.run(["fish", "--no-config", "-c", f"source {script}; complete -C '{line}'"],
                       capture_output=True, text=True, timeout=60,
                       env=_env(daemon, PYTHONPATH=str(ROOT), PATH=path))
    assert r.returncode == 0, r.stderr
    return [row.split("\t", 1)[0] for row in r.stdout.splitlines()]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed (.ci/run installs it)")
def test_fish_completes_commands_options_and_sessions(tmp_path, daemon):
    script = tmp_path / "dsh.fish"
    script.write_text(subprocess.run([*DSH, "completion", "fish"], capture_output=True,
                                     text=True, timeout=60, env=_env(daemon)).stdout)
    assert _fish_complete(daemon, script, "dsh he") == ["help"]
    assert "--timeout" in _fish_complete(daemon, script, "dsh run --ti")
    if SESSION_COMPLETION:
        made = _named_sessions(daemon, tmp_path)
        offered = set(_fish_complete(daemon, script, "dsh log "))
        assert {"build", "bench-7", made["unnamed"]} <= offered


@pytest.mark.skipif(not have_tmux() or shutil.which("zsh") is None,
                    reason="tmux or zsh is not installed (.ci/run installs them)")
def test_tab_in_a_real_zsh_completes_commands_and_sessions(tmp_path, daemon):
    made = _named_sessions(daemon, tmp_path) if SESSION_COMPLETION else {}
    pane = Pane(tmp_path, str(daemon.socket), tmp_path, cols=160, rows=40)
    try:
        pane.line("exec zsh -f")
        pane.line("PS1='zsh%% '; autoload -Uz compinit && compinit -u && "
                  "source <(dsh completion zsh); echo READY-$?")
        pane.until(r"^READY-0")
        pane.type("dsh comp", literal=True)
        pane.type("Tab")
        pane.type("#", literal=True)
        pane.until(r"^zsh% dsh completion #$")
        pane.type("C-u")
        if made:
            pane.type("dsh log bui", literal=True)
            pane.type("Tab")
            pane.type("#", literal=True)
            pane.until(r"^zsh% dsh log build #$")
    finally:
        pane.close()
