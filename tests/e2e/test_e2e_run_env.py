"""``dsh run`` (issue 15): a call's own environment, a session's sandbox changed later, and the
checks made before any session is created -- through the real CLI against a real dshd."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import trio

from client.api import connect
from dshd.storage.reader import read_log
from protocol.rpc import INVALID_PARAMS, RpcError

from .conftest import DaemonProcess, running_daemon


def _sessions(daemon) -> list[str]:
    listed = json.loads(daemon.dsh("--json", "sessions").stdout)
    listed = listed["sessions"] if isinstance(listed, dict) else listed
    return [s["sessionId"] for s in listed]


def _sid(stderr: str) -> str:
    return stderr.split("session ", 1)[1].split()[0]


@pytest.mark.parametrize("provider", ["bwrap", "landlock"])
def test_env_and_env_file_reach_the_command_and_the_clients_env_does_not(workdir, provider):
    envfile = workdir / "vars.env"
    envfile.write_text("# a comment\nFROMFILE=file\nexport QUOTED=\"a b\"\nOVER=file\n"
                       "KEEP=${HOME}\n")
    with running_daemon(f'sandbox_provider = "{provider}"\n') as d:
        d.env["LEAKED"] = "from-the-client"
        r = d.dsh("run", "--env", "FOO=bar", "--env", "OVER=flag", "--env-file", str(envfile),
                  "--", "sh", "-c", 'echo "$FOO|$FROMFILE|$QUOTED|$OVER|$KEEP|[$LEAKED]"',
                  cwd=str(workdir))
        assert r.returncode == 0, r.stderr
        assert r.stdout == "bar|file|a b|flag|${HOME}|[]\n"


@pytest.mark.parametrize("provider", ["bwrap", "landlock"])
async def test_call_env_is_merged_over_the_session_env_for_that_call_only(workdir, provider):
    with running_daemon(f'sandbox_provider = "{provider}"\n') as d:
        async with connect(str(d.socket)) as c:
            sid = await c.create_session(str(workdir), env={"A": "session", "B": "session"})
        r = d.dsh("run", "--session", sid, "--env", "B=call", "--", "sh", "-c", 'echo $A $B',
                  cwd=str(workdir))
        assert (r.returncode, r.stdout) == (0, "session call\n"), r.stderr
        r = d.dsh("run", "--session", sid, "--", "sh", "-c", 'echo $A $B', cwd=str(workdir))
        assert (r.returncode, r.stdout) == (0, "session session\n"), r.stderr


async def test_daemon_refuses_a_bad_call_env_naming_the_field(daemon, workdir):
    async with connect(str(daemon.socket)) as c:
        sid = await c.create_session(str(workdir))
        for env, says in [({"DSH_RUN": "x"}, "DSH_RUN"), ({"1A": "x"}, "shell names"),
                          ({"A": "x\0y"}, "NUL"),
                          ({f"V{i}": "x" for i in range(257)}, "arguments.env"),
                          ({"A": "x" * 40_000}, "arguments.env")]:
            with pytest.raises(RpcError) as err:
                await c.start_tool(sid, "true", env=env)
            assert err.value.code == INVALID_PARAMS
            assert says in err.value.message or says == err.value.data.get("field"), err.value
            assert err.value.data["field"].startswith("arguments.env"), err.value.data
        assert (await c.get_session(sid))["running"] == 0


@pytest.mark.parametrize("args, says", [
    (["--env", "NOEQUALS"], "KEY=VALUE"),
    (["--env", "DSH_CALL_ID=x"], "DSH_CALL_ID"),
    (["--env", "1BAD=x"], "shell names"),
    (["--timeout", "inf"], "--timeout"),
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "1e308"], "--timeout"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "-1"], "--timeout"),
])
def test_bad_run_options_are_usage_errors_before_any_session(daemon, workdir, args, says):
    r = daemon.dsh("run", *args, "--", "true", cwd=str(workdir))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert says in r.stderr and "Traceback" not in r.stderr
    assert _sessions(daemon) == []


@pytest.mark.parametrize("argv", [[""], ["   "]])
def test_an_empty_command_is_a_usage_error_before_any_session(daemon, workdir, argv):
    r = daemon.dsh("run", "--", *argv, cwd=str(workdir))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "empty" in r.stderr and "Traceback" not in r.stderr
    assert _sessions(daemon) == []


def test_env_file_line_that_does_not_parse_is_named(daemon, workdir):
    bad = workdir / "bad.env"
    bad.write_text("A=1\nB\n")
    r = daemon.dsh("run", "--env-file", str(bad), "--", "true", cwd=str(workdir))
    assert r.returncode == 2 and f"{bad}:2" in r.stderr, r.stderr
    assert _sessions(daemon) == []


def test_help_says_the_clients_environment_is_not_passed(daemon):
    r = daemon.dsh("run", "--help")
    assert "environment of this dsh is NOT passed" in r.stdout


def test_run_sandbox_on_an_existing_session_changes_it_audited(daemon, workdir):
    r = daemon.dsh("run", "--", "touch", "first", cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    sid = _sid(r.stderr)
    r = daemon.dsh("run", "--session", sid, "--sandbox", "read-only", "--", "touch", "second",
                   cwd=str(workdir))
    assert r.returncode != 0 and not (workdir / "second").exists()
    assert f"session {sid}: sandbox is now read-only" in r.stderr
    info = json.loads(daemon.dsh("--json", "sessions").stdout)
    info = info["sessions"] if isinstance(info, dict) else info
    assert [s["sandbox"] for s in info if s["sessionId"] == sid] == ["read-only"]
    events = [json.loads(line) for line in daemon.dsh("log", sid, "--json").stdout.splitlines()]
    modes = [e["data"] for e in events if e["type"] == "sandbox/mode"]
    assert modes[-1] == {"mode": "read-only", "source": "session.setSandbox",
                         "by": os.getuid()}  # audited with its caller
    daemon.restart()  # durable: the next daemon confines by it too
    r = daemon.dsh("run", "--session", sid, "--", "touch", "third", cwd=str(workdir))
    assert r.returncode != 0 and not (workdir / "third").exists()


def test_deleted_cwd_is_one_clear_line(daemon, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    script = ("import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
              "sys.argv = ['dsh', 'run', '--', 'true']; from client.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", script, str(gone)], env=daemon.env,
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "current directory" in r.stderr
    assert _sessions(daemon) == []


def test_session_whose_cwd_was_deleted_says_so(daemon, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    r = daemon.dsh("run", "--", "true", cwd=str(work))
    sid = _sid(r.stderr)
    os.rmdir(work)
    r = daemon.dsh("run", "--session", sid, "--", "true", cwd=str(tmp_path))
    assert r.returncode == 125, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and str(work) in r.stderr, r.stderr
    assert "Traceback" not in daemon.log_path.read_text(errors="replace")


@pytest.mark.parametrize("snapshots", [0, 3])
def test_call_id_reused_with_another_command_is_refused_even_after_a_restart(workdir, snapshots):
    """The same --call-id and command answers `existing`; another command (or env) is
    CALL_ID_REUSED and runs nothing -- from the log's tail after a restart, and (with a
    snapshot every 3 events) from the snapshot chain's digests."""
    with running_daemon(f"snapshot_every_events = {snapshots}\n") as d:
        r = d.dsh("run", "--", "echo", "one", cwd=str(workdir))
        sid = _sid(r.stderr)
        first = d.dsh("run", "--session", sid, "--call-id", "k1", "--", "echo", "one",
                      cwd=str(workdir))
        assert (first.returncode, first.stdout) == (0, "one\n"), first.stderr
        for _ in range(4):  # past a few snapshots
            assert d.dsh("run", "--session", sid, "--", "true", cwd=str(workdir)).returncode == 0
        for restart in (False, True):
            if restart:
                d.restart()
            same = d.dsh("run", "--session", sid, "--call-id", "k1", "--", "echo", "one",
                         cwd=str(workdir))
            assert (same.returncode, same.stdout) == (0, "one\n"), same.stderr
            assert "already exists" in same.stderr
            for other in (["--", "echo", "two"], ["--env", "A=b", "--", "echo", "one"]):
                r = d.dsh("run", "--session", sid, "--call-id", "k1", *other, cwd=str(workdir))
                assert r.returncode == 2, (r.stdout, r.stderr)
                assert r.stdout == "" and "another command" in r.stderr, r.stderr
        events = [json.loads(x) for x in d.dsh("log", sid, "--json").stdout.splitlines()]
        assert [e["data"]["callId"] for e in events if e["type"] == "tool/call"].count("k1") == 1
        read = read_log(d.state_dir / "sessions" / sid, sid, fold=True)
        assert (read.snapshot is not None) == bool(snapshots)
        if snapshots:  # the digests the chain was read from
            assert "k1" in read.snapshot.data["session"]["calls"]["digests"] or any(
                "k1" in e.data.get("session", {}).get("calls", {}).get("digests", {})
                for e in read_log(d.state_dir / "sessions" / sid, sid).events
                if e.type == "log/snapshot")


async def test_call_id_reused_is_invalid_params_with_its_code(daemon, workdir):
    async with connect(str(daemon.socket)) as c:
        sid = await c.create_session(str(workdir))
        await c.start_tool(sid, "echo a", call_id="same", tty=(80, 24))
        again = await c.start_tool(sid, "echo a", call_id="same", tty=(120, 40))
        assert again.existing  # the terminal's size is not another call
        with pytest.raises(RpcError) as err:
            await c.start_tool(sid, "echo b", call_id="same")
        assert err.value.code == INVALID_PARAMS
        assert err.value.data == {"field": "callId", "code": "CALL_ID_REUSED"}


@pytest.fixture
def small_state_fs(tmp_path):
    """A daemon whose state directory is a real 8 MiB tmpfs (root only: CI runs as root)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs as the state directory")
    root = tmp_path / "root"
    (root / "state").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(root / "state")],
                   check=True)
    d = DaemonProcess(root)
    try:
        d.start()
        yield d
    finally:
        d.close()
        subprocess.run(["umount", "-l", str(root / "state")], check=False)


def _fill(path) -> None:
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_full_disk_exits_125_and_keeps_the_session(small_state_fs, workdir):
    d = small_state_fs
    r = d.dsh("run", "--", "echo", "before", cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    sid = _sid(r.stderr)
    filler = d.state_dir / "filler"
    _fill(filler)
    new = d.dsh("run", "--", "echo", "hi", cwd=str(workdir))
    assert new.returncode == 125, (new.stdout, new.stderr)
    assert "STORAGE_FAILURE" in new.stderr and "no session was made" in new.stderr
    old = d.dsh("run", "--session", sid, "--", "echo", "again", cwd=str(workdir))
    assert old.returncode == 125, (old.stdout, old.stderr)
    assert "Traceback" not in new.stderr + old.stderr
    filler.unlink()
    assert _sessions(d) == [sid]  # kept; the one that could not be made is not listed
    r = d.dsh("run", "--session", sid, "--", "echo", "after", cwd=str(workdir))
    assert (r.returncode, r.stdout) == (0, "after\n"), r.stderr


def test_run_into_head_detaches_at_once_and_says_how_to_cancel(daemon, workdir):
    """`dsh run ... | head -1`: head exits after the first line while the command goes on
    silently; dsh notices the closed pipe without writing, says one line (re-attach, cancel)
    and exits 141; the command keeps running until cancelled."""
    needle = "sleep 60.4171"
    p = subprocess.run(
        f"{sys.executable} -m client.cli run --call-id piped -- sh -c 'echo one; echo two; "
        f"{needle}' | head -1; echo \"status=${{PIPESTATUS[0]}}\"", shell=True,
        executable="/bin/bash", env=daemon.env, cwd=str(workdir), capture_output=True,
        text=True, timeout=40)
    assert p.stdout == "one\nstatus=141\n", (p.stdout, p.stderr)
    lines = [x for x in p.stderr.splitlines() if x.startswith("dsh:")]
    sid = _sid(p.stderr)
    assert lines == [f"dsh: stdout was closed; detached, the command keeps running. Re-attach: "
                     f"dsh attach {sid} --call piped; cancel: dsh cancel {sid} piped"], p.stderr
    r = daemon.dsh("cancel", sid, "piped")
    assert r.returncode == 0, r.stderr  # it was still running


def test_run_json_prints_the_result_instead_of_the_output(daemon, workdir):
    for flags in (["run", "--json"], ["--json", "run"]):
        r = daemon.dsh(*flags, "--", "sh", "-c", "echo out; exit 3", cwd=str(workdir))
        assert r.returncode == 3, r.stderr
        result = json.loads(r.stdout)  # one line of JSON, nothing else
        assert result["exitCode"] == 3 and result["content"] == "out\n"
        assert result["isError"] is True
    r = daemon.dsh("run", "--json", "-t", "--", "true", cwd=str(workdir))
    assert r.returncode == 2 and "--json" in r.stderr


async def test_attach_json_prints_each_result_as_a_line(daemon, workdir):
    r = daemon.dsh("run", "--call-id", "a1", "--", "true", cwd=str(workdir))
    sid = _sid(r.stderr)
    p = subprocess.Popen([sys.executable, "-m", "client.cli", "run", "--session", sid,
                          "--call-id", "slow", "--", "sh", "-c", "sleep 4; echo done; exit 4"],
                         env=daemon.env, cwd=str(workdir), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        async with connect(str(daemon.socket)) as c:  # until it runs (bounded)
            with trio.fail_after(20):
                async for view in await c.subscribe(sid):
                    if view["tools"].get("slow", {}).get("state") == "running":
                        break
        r = daemon.dsh("attach", "--json", sid)
        assert r.returncode == 4, r.stderr
        line = json.loads(r.stdout)
        assert (line["sessionId"], line["callId"]) == (sid, "slow")
        assert line["result"]["content"] == "done\n" and line["result"]["exitCode"] == 4
        r = daemon.dsh("attach", "--json", sid, "--call", "a1")
        assert r.returncode == 0 and json.loads(r.stdout)["result"]["exitCode"] == 0
    finally:
        p.wait(timeout=30)


def test_run_name_reuses_the_named_session_or_makes_it(daemon, workdir, tmp_path):
    r = daemon.dsh("run", "--name", "build", "--title", "the build", "--", "echo", "one",
                   cwd=str(workdir))
    assert (r.returncode, r.stdout) == (0, "one\n"), r.stderr
    sid = _sid(r.stderr)
    other = tmp_path / "other"
    other.mkdir()
    r = daemon.dsh("run", "--name", "build", "--", "echo", "two", cwd=str(other))
    assert (r.returncode, r.stdout) == (0, "two\n"), r.stderr
    assert f"dsh: using session {sid} (build)" in r.stderr and _sid(r.stderr) == sid
    listed = json.loads(daemon.dsh("--json", "sessions").stdout)
    listed = listed["sessions"] if isinstance(listed, dict) else listed
    assert [(s["sessionId"], s["name"], s["title"]) for s in listed] == [
        (sid, "build", "the build")]
    # a prefix of the name is not the name: a new session named "bui"
    r = daemon.dsh("run", "--name", "bui", "--", "true", cwd=str(workdir))
    assert r.returncode == 0 and _sid(r.stderr) != sid, r.stderr
    # --policy on an existing session is refused before anything runs
    r = daemon.dsh("run", "--name", "build", "--policy", "ask", "--", "echo", "x",
                   cwd=str(workdir))
    assert r.returncode == 2 and "dsh policy" in r.stderr and r.stdout == ""
    r = daemon.dsh("run", "--name", "-bad", "--", "true", cwd=str(workdir))
    assert r.returncode == 2 and "--name" in r.stderr
    r = daemon.dsh("run", "--session", sid, "--title", "t", "--", "true", cwd=str(workdir))
    assert r.returncode == 2
