"""Issue 10, the spawn side (items 8, 20, 22): signals, commands of any size, the tool's
environment — against a real dshd over its socket (see :mod:`tests.e2e.spawn_rpc`).

* Item 8: cancel and timeout send SIGTERM to the command (not to bwrap's own processes), so a
  ``trap ... TERM`` runs and its exit code comes back, every time, under bwrap and Landlock; a
  command that ignores TERM is KILLed after the grace with nothing of its tree left.
* Item 20: a 1 MiB heredoc runs (the script does not travel in argv); a NUL in the command is
  refused at the boundary with -32602 and nothing is recorded.
* Item 22: tools get a documented minimal environment, not the daemon's.
"""

from __future__ import annotations

import os
import pwd
import secrets
import time
from pathlib import Path

import pytest

from .conftest import live_processes_matching, wait_until_gone
from .test_e2e_system_mode import system_daemon  # noqa: F401 (fixture)
from .spawn_rpc import Daemon

PROVIDERS = ["bwrap", "landlock"]
RUNS = 20
BATCH = 5

TRAP = ("sh -c 'trap \"echo trapped; exit 42\" TERM; echo ready; touch {ready}; "
        "while :; do sleep 0.1; done'")


def _wait_file(path: Path, bound: float = 60.0) -> None:
    deadline = time.monotonic() + bound
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.fixture(params=PROVIDERS)
def provider_daemon(request):
    with Daemon(f'sandbox_provider = "{request.param}"\n') as d:
        rpc = d.rpc()
        assert rpc.server["sandbox"]["provider"] == request.param
        yield d, rpc
        rpc.close()


# ---------------------------------------------------------------------- item 8
def test_cancel_runs_the_commands_term_trap_every_time(provider_daemon, workdir):
    d, rpc = provider_daemon
    sid = rpc.session(workdir)
    for batch in range(RUNS // BATCH):
        calls = []
        for i in range(BATCH):
            ready = workdir / f"ready-{batch}-{i}"
            calls.append((rpc.start(sid, TRAP.format(ready=ready)), ready))
        for cid, ready in calls:
            _wait_file(ready)
            assert rpc.result("tool.cancel", {"sessionId": sid, "callId": cid})["cancelled"]
        for cid, _ in calls:
            result = rpc.wait(sid, cid)
            lines = result["content"].splitlines()  # sh may report its TERMed `sleep` between
            assert lines[0] == "ready" and lines[-1] == "trapped", result
            assert result["exitCode"] == 42, result
            assert result["errorCode"] == "TOOL_CANCELLED", result


def test_timeout_runs_the_commands_term_trap_every_time(provider_daemon, workdir):
    d, rpc = provider_daemon
    sid = rpc.session(workdir)
    for batch in range(RUNS // BATCH):
        calls = [rpc.start(sid, TRAP.format(ready=workdir / f"r-{batch}-{i}"), timeout=5)
                 for i in range(BATCH)]
        for cid in calls:
            result = rpc.wait(sid, cid)
            lines = result["content"].splitlines()  # sh may report its TERMed `sleep` between
            assert lines[0] == "ready" and lines[-1] == "trapped", result
            assert result["exitCode"] == 42, result
            assert result["errorCode"] == "TOOL_TIMEOUT", result


def test_a_command_ignoring_term_is_killed_with_its_whole_tree(provider_daemon, workdir):
    """TERM is ignored by the command, a background child and a double-forked ``setsid`` child;
    after the grace (2 s) KILL reaches all of them."""
    d, rpc = provider_daemon
    sid = rpc.session(workdir)
    marker = f"dsh-spawn-marker-{secrets.token_hex(4)}"
    loop = "trap \"\" TERM; while :; do sleep 0.1; done"
    command = (
        f"trap '' TERM; "
        f"sh -c '{loop}' {marker}-bg & "
        f"( setsid sh -c '{loop}' {marker}-setsid & ) ; "
        f"echo ready; touch {workdir}/ready; while :; do sleep 0.1; done"
    )
    cid = rpc.start(sid, command)
    _wait_file(workdir / "ready")
    deadline = time.monotonic() + 30
    while len(live_processes_matching(marker)) < 2:
        assert time.monotonic() < deadline, "the background children never started"
        time.sleep(0.05)
    started = time.monotonic()
    assert rpc.result("tool.cancel", {"sessionId": sid, "callId": cid})["cancelled"]
    result = rpc.wait(sid, cid)
    assert time.monotonic() - started >= 2.0  # the grace was given: TERM first, KILL after
    assert result["errorCode"] == "TOOL_CANCELLED", result
    assert result["exitCode"] == 128 + 9, result
    assert wait_until_gone(marker) == []


def test_daemon_stop_runs_the_commands_term_trap(workdir):
    """Under ``on_stop = "cancel"`` a daemon stop ends a call with TERM first (its trap runs);
    the default ``"detach"`` leaves it running (tests/daemon/test_restart.py, issue 13)."""
    for provider in PROVIDERS:
        with Daemon(f'sandbox_provider = "{provider}"\non_stop = "cancel"\n') as d:
            rpc = d.rpc()
            sid = rpc.session(workdir)
            out = workdir / f"trap-{provider}"
            rpc.start(sid, f"trap 'echo trapped > {out}; exit 42' TERM; touch {workdir}/up-{provider}; "
                           "while :; do sleep 0.1; done")
            _wait_file(workdir / f"up-{provider}")
            d.stop()
            rpc.close()
            assert out.read_text() == "trapped\n", provider


# ---------------------------------------------------------------------- item 20
def _heredoc(target: Path, size: int) -> tuple[str, str]:
    line = "0123456789abcdef" * 7 + "-line\n"
    body = (line * (size // len(line) + 1))[:size].rstrip("\n") + "\n"
    return f"cat > {target} <<'DSH_EOF'\n{body}DSH_EOF\necho wrote", body


@pytest.mark.parametrize("mode", ["workspace-write", "danger-full-access"])
def test_a_one_mib_heredoc_writes_its_file(provider_daemon, workdir, mode):
    d, rpc = provider_daemon
    sid = rpc.session(workdir, sandbox=mode)
    target = workdir / "big.txt"
    command, body = _heredoc(target, 1 << 20)
    result = rpc.run(sid, command)
    assert result["exitCode"] == 0, {k: v for k, v in result.items() if k != "content"} | {
        "content": result["content"][:500]}
    assert result["content"] == "wrote\n"
    assert target.read_text() == body


def test_small_commands_keep_bash_c_semantics(provider_daemon, workdir):
    """Ordinary commands still run as ``bash -c``: ``$0`` is the shell, and a lone command is
    exec'd by bash (no shell left between the sandbox and the command to die of SIGTERM)."""
    d, rpc = provider_daemon
    sid = rpc.session(workdir)
    result = rpc.run(sid, 'echo "$0"')
    assert result["exitCode"] == 0 and result["content"].strip().endswith("bash"), result
    result = rpc.run(sid, 'sh -c "echo \\$\\$ $$"')  # sh's own pid, then bash's
    sh_pid, bash_pid = result["content"].split()
    assert sh_pid == bash_pid, result  # the same process: bash exec'd sh


def test_nul_in_a_command_is_refused_and_nothing_is_recorded(workdir):
    with Daemon() as d:
        rpc = d.rpc()
        sid = rpc.session(workdir)
        before = rpc.events(sid)
        msg = rpc.call("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                    "arguments": {"command": "echo a\u0000b"}})
        assert msg["error"]["code"] == -32602, msg
        assert "NUL" in msg["error"]["message"]
        after = rpc.events(sid)
        assert after == before
        assert not any(e["type"].startswith("tool/") for e in after)
        rpc.close()


# ---------------------------------------------------------------------- item 22
ENV_PROBE = ("for v in FOO HOME PATH USER LOGNAME DSH_SOCKET DSH_STATE_DIR DSH_CALL_ID "
             "DSH_SESSION_ID LANG SESSVAR; do printf '%s=%s\\n' \"$v\" \"${!v-<unset>}\"; done")


def _env_of(d: Daemon, workdir: Path, mode: str = "workspace-write") -> dict[str, str]:
    rpc = d.rpc()
    try:
        sid = rpc.session(workdir, sandbox=mode, env={"SESSVAR": "from-session"})
        result = rpc.run(sid, ENV_PROBE)
        assert result["exitCode"] == 0, result
        return dict(line.split("=", 1) for line in result["content"].splitlines())
    finally:
        rpc.close()


def _daemon_env(**extra: str) -> dict[str, str]:
    # HOME and USER deliberately wrong: the tool gets its owner's, from the password database.
    return dict(os.environ, FOO="secret", LANG="C.UTF-8", HOME="/nonexistent-daemon-home",
                USER="not-the-owner", **extra)


@pytest.mark.parametrize("mode", ["workspace-write", "danger-full-access"])
def test_tools_get_a_minimal_environment(workdir, mode):
    with Daemon(env=_daemon_env()) as d:
        assert "DSH_SOCKET" in d.env and "DSH_STATE_DIR" in d.env
        env = _env_of(d, workdir, mode)
    assert env["FOO"] == "<unset>"
    assert env["DSH_SOCKET"] == "<unset>" and env["DSH_STATE_DIR"] == "<unset>"
    me = pwd.getpwuid(os.getuid())
    assert env["HOME"] == me.pw_dir and env["USER"] == me.pw_name == env["LOGNAME"]
    assert env["LANG"] == "C.UTF-8" and env["PATH"] != "<unset>"
    assert env["DSH_CALL_ID"].startswith("c-") and env["DSH_SESSION_ID"] != "<unset>"
    assert env["SESSVAR"] == "from-session"


def test_pass_env_adds_named_daemon_variables(workdir):
    with Daemon('pass_env = ["FOO"]\n', env=_daemon_env()) as d:
        env = _env_of(d, workdir)
    assert env["FOO"] == "secret"
    assert env["DSH_SOCKET"] == "<unset>"


def test_pass_env_refuses_dshs_own_variables(workdir):
    d = Daemon('pass_env = ["DSH_SOCKET"]\n', env=_daemon_env())
    try:
        with pytest.raises(RuntimeError, match=r"DSH_.*pass_env\[0\]"):
            d.start()
    finally:
        d.close()


def _as_big(user, socket_path: Path, requests: list, scratch: Path) -> list:
    """``test_e2e_system_mode._as`` with the requests in a file (1 MiB does not fit in argv)."""
    import json
    import subprocess
    import sys

    from .test_e2e_system_mode import CLIENT

    req = scratch / "requests.json"
    req.write_text(json.dumps(requests))
    req.chmod(0o644)
    loader = ("import sys; sys.argv[2] = open(sys.argv[2]).read(); "
              f"exec(compile({CLIENT!r}, 'client', 'exec'))")
    r = subprocess.run(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
         sys.executable, "-c", loader, str(socket_path), str(req)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_one_mib_heredoc_runs_as_another_uid_in_system_mode(system_daemon):
    d, member, stranger, mine, secret = system_daemon
    command, body = _heredoc(mine / "big.txt", 1 << 20)
    out = _as_big(member, d.socket, [
        ["session.create", {"cwd": str(mine)}],
        ["tool.run", {"sessionId": "$SID", "name": "bash", "approved": True,
                      "arguments": {"command": command + "; id -u; echo HOME=$HOME"}}],
        ["tool.wait", {"sessionId": "$SID", "callId": "$CID"}],
    ], d.root)
    result = out[3]["result"]
    assert result["exitCode"] == 0, result
    assert result["content"].splitlines() == ["wrote", str(member.pw_uid), f"HOME={member.pw_dir}"]
    assert (mine / "big.txt").read_text() == body
    assert (mine / "big.txt").stat().st_uid == member.pw_uid
