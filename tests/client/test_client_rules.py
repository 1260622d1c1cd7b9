"""Approval rules, the pending list and the ask timeout (PROTOCOL.md §3.4), through the real
``dsh`` against a real dshd: ``dsh run --ask [--ask-timeout]``, ``dsh approvals``,
``dsh approve APPROVAL --allow-for-session [--prefix]``, ``dsh policy --rules/--revoke``;
rules surviving a snapshot and a restart."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from client.api import connect
from dsh_proc import Live, dsh
from dshd.storage.reader import read_log
from dshd.testing import DshdProcess

LIVENESS = 20


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="dsh-w-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def snappy_dshd():
    """A dshd that writes a snapshot every 4 events (rules must live in the snapshot)."""
    root = Path(tempfile.mkdtemp(prefix="dsh-ru-", dir="/tmp"))
    config = root / "dshd.toml"
    config.write_text("snapshot_every_events = 4\n")
    daemon = DshdProcess(root, extra_args=["--config", str(config)])
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.close()
        shutil.rmtree(root, ignore_errors=True)


async def _session(daemon, workdir: Path) -> str:
    async with connect(daemon.socket) as c:
        return await c.create_session(workdir, approval_policy="ask")


async def _pending_id(daemon, call_id: str) -> str:
    """The approval id of ``call_id`` as ``dsh approvals --json`` lists it (once it does)."""
    with trio.fail_after(LIVENESS):
        while True:
            proc = await dsh(daemon.socket, "approvals", "--json")
            assert proc.returncode == 0, proc.stderr
            for p in json.loads(proc.stdout)["approvals"]:
                if p["callId"] == call_id:
                    return p["approvalId"]
            await trio.sleep(0.05)


async def _asked(daemon, sid: str, call_id: str, command: str, *rest: str) -> Live:
    run = await Live(Path(tempfile.mkdtemp(prefix="dsh-rl-", dir="/tmp")), call_id).start(
        daemon.socket, "run", "--ask", "--ask-timeout", "30", "--session", sid, "--call-id",
        call_id, *rest, "--", command)
    return run


async def _decisions(daemon, sid: str) -> list[dict]:
    async with connect(daemon.socket) as c:
        out = []
        async for raw in c.iter_records(sid):
            ev = json.loads(bytes(raw))
            if ev["type"].startswith("approval/"):
                out.append({"type": ev["type"], **ev["data"]})
        return out


async def _make_prefix_rule(daemon, sid: str, prefix: str, command: str) -> str:
    run = await _asked(daemon, sid, "k1", command)
    try:
        aid = await _pending_id(daemon, "k1")
        proc = await dsh(daemon.socket, "approve", aid, "--allow-for-session", "--prefix", prefix)
        assert proc.returncode == 0, proc.stderr
        err = proc.stderr.decode()
        rule_id = err.split("dsh: rule ", 1)[1].split(" ", 1)[0]
        assert proc.stdout.decode() == \
            f"allowed for the session by rule {rule_id} (prefix {prefix})\n"
        assert f"take it back with `dsh policy {sid} --revoke {rule_id}`" in err
        assert await run.wait() == 0
    finally:
        run.kill()
    return rule_id


async def _run_no_wait(daemon, sid: str, command: str, call_id: str):
    """``dsh run --ask --ask-timeout 0``: nobody is attached, so only a rule can allow it."""
    return await dsh(daemon.socket, "run", "--ask", "--ask-timeout", "0", "--session", sid,
                     "--call-id", call_id, "--", command)


async def test_a_prefix_rule_allows_the_next_call_with_its_audit_pair_and_no_hostile_one(
        snappy_dshd, workdir):
    daemon = snappy_dshd
    sid = await _session(daemon, workdir)
    rule_id = await _make_prefix_rule(daemon, sid, "echo hello", "echo hello first")
    proc = await _run_no_wait(daemon, sid, "echo hello 'second one'", "k2")
    assert (proc.returncode, proc.stdout) == (0, b"hello second one\n"), proc.stderr
    events = await _decisions(daemon, sid)
    [rule] = [e for e in events if e["type"] == "approval/rule"]
    assert (rule["ruleId"], rule["kind"], rule["words"]) == (rule_id, "prefix", ["echo", "hello"])
    first_decided = next(e for e in events if e["type"] == "approval/decided")
    assert events.index(rule) < events.index(first_decided)  # the rule before the decision
    assert (first_decided["by"], first_decided["ruleId"]) == ("answerer", rule_id)
    asked = [e for e in events if e["type"] == "approval/asked" and e["callId"] == "k2"]
    assert len(asked) == 1 and asked[0]["summary"] == "echo hello 'second one'"
    [decided] = [e for e in events if e["type"] == "approval/decided"
                 and e["approvalId"] == asked[0]["approvalId"]]
    assert (decided["outcome"], decided["by"], decided["ruleId"]) == (
        "allowed-once", "rule", rule_id)
    # Hostile commands that start with the rule's words are asked (nobody: unavailable).
    for n, hostile in enumerate(["echo hello; touch pwned", "echo hello $(touch pwned)",
                                 "echo hello && touch pwned", "echo hello | tee pwned",
                                 "echo hello > pwned", "echo hello `touch pwned`",
                                 "echo hello\ntouch pwned"]):
        proc = await _run_no_wait(daemon, sid, hostile, f"h{n}")
        assert proc.returncode == 125, (hostile, proc.stderr)
        assert b"APPROVAL_UNAVAILABLE" in proc.stderr
    assert not (workdir / "pwned").exists()
    # Listed, revoked, then asked again.
    proc = await dsh(daemon.socket, "policy", sid, "--rules")
    assert proc.returncode == 0
    lines = proc.stdout.decode().splitlines()
    assert lines[0].split() == ["RULE", "KIND", "COMMAND", "BY", "MADE"]
    assert lines[1].split()[:4] == [rule_id, "prefix", "echo", "hello"]
    proc = await dsh(daemon.socket, "policy", sid, "--revoke", rule_id)
    assert proc.returncode == 0, proc.stderr
    proc = await _run_no_wait(daemon, sid, "echo hello third", "k3")
    assert proc.returncode == 125 and b"APPROVAL_UNAVAILABLE" in proc.stderr
    proc = await dsh(daemon.socket, "--json", "policy", sid, "--rules")
    assert json.loads(proc.stdout) == {"sessionId": sid, "rules": []}
    proc = await dsh(daemon.socket, "policy", sid, "--revoke", rule_id)
    assert proc.returncode == 1 and b"is not a live rule" in proc.stderr


async def test_rules_survive_a_snapshot_and_a_restart_and_so_does_a_revoke(snappy_dshd, workdir):
    daemon = snappy_dshd
    sid = await _session(daemon, workdir)
    rule_id = await _make_prefix_rule(daemon, sid, "echo kept", "echo kept 0")
    for n in range(1, 4):  # events past the rule: snapshots after it
        assert (await _run_no_wait(daemon, sid, f"echo kept {n}", f"p{n}")).returncode == 0
    daemon.stop()
    read = read_log(daemon.state_dir / "sessions" / sid, sid)
    rule_seq = next(e.seq for e in read.events if e.type == "approval/rule")
    snaps = [e for e in read.events if e.type == "log/snapshot" and e.seq > rule_seq]
    assert snaps and snaps[-1].data["session"]["rules"][0]["ruleId"] == rule_id
    daemon.start()
    proc = await _run_no_wait(daemon, sid, "echo kept after restart", "r1")
    assert (proc.returncode, proc.stdout) == (0, b"kept after restart\n"), proc.stderr
    assert (await dsh(daemon.socket, "policy", sid, "--revoke", rule_id)).returncode == 0
    for n in range(3):  # the revoke, too, gets snapshots after it
        await _run_no_wait(daemon, sid, "true", f"t{n}")
    daemon.stop()
    daemon.start()
    proc = await _run_no_wait(daemon, sid, "echo kept again", "r2")
    assert proc.returncode == 125 and b"APPROVAL_UNAVAILABLE" in proc.stderr


async def test_an_exact_rule_allows_only_that_text(snappy_dshd, workdir):
    daemon = snappy_dshd
    sid = await _session(daemon, workdir)
    command = "echo a && echo b"
    run = await _asked(daemon, sid, "e1", command)
    try:
        aid = await _pending_id(daemon, "e1")
        # a prefix rule cannot be made from a compound command: said, nothing decided
        proc = await dsh(daemon.socket, "approve", aid, "--allow-for-session", "--prefix", "echo a")
        assert proc.returncode == 1 and b"exact rule" in proc.stderr
        assert await _pending_id(daemon, "e1") == aid
        proc = await dsh(daemon.socket, "--json", "approve", sid, aid, "--allow-for-session")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["outcome"] == "allowed-once"
        assert await run.wait() == 0
    finally:
        run.kill()
    assert (await _run_no_wait(daemon, sid, command, "e2")).stdout == b"a\nb\n"
    assert (await _run_no_wait(daemon, sid, command + " ", "e3")).returncode == 125


async def test_run_ask_on_a_new_session_waits_and_is_answered_from_another_terminal(
        snappy_dshd, workdir):
    daemon = snappy_dshd
    run = await Live(workdir, "run").start(daemon.socket, "run", "--ask", "--", "echo answered",
                                           cwd=workdir)
    try:
        await run.until("waits for approval ")
        assert "`dsh approvals` lists what waits" in run.err
        with trio.fail_after(LIVENESS):
            while True:
                proc = await dsh(daemon.socket, "approvals")
                if b"echo answered" in proc.stdout:
                    break
                await trio.sleep(0.05)
        header, row = proc.stdout.decode().splitlines()
        assert header.split() == ["SESSION", "APPROVAL", "COMMAND", "ASKED"]
        aid = row.split()[1]
        assert aid.startswith("a-") and "echo answered" in row
        proc = await dsh(daemon.socket, "approve", aid)
        assert (proc.returncode, proc.stdout) == (0, b"allowed-once\n"), proc.stderr
        assert await run.wait() == 0
    finally:
        run.kill()
    assert run.out == "answered\n"
    assert (await dsh(daemon.socket, "approvals")).stderr == b"no approval is pending\n"
    proc = await dsh(daemon.socket, "approve", aid)  # decided: not pending anywhere now
    assert proc.returncode == 1 and f"approval {aid} is not pending".encode() in proc.stderr


async def test_an_ask_timeout_that_expires_is_unavailable(snappy_dshd, workdir):
    proc = await dsh(snappy_dshd.socket, "run", "--ask", "--ask-timeout", "1", "--",
                     "echo never", cwd=workdir)
    assert proc.returncode == 125 and proc.stdout == b""
    err = proc.stderr.decode()
    assert "APPROVAL_UNAVAILABLE" in err and "within its askTimeout" in err


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "3601"])
async def test_a_bad_ask_timeout_is_a_usage_error(snappy_dshd, workdir, value):
    proc = await dsh(snappy_dshd.socket, "run", "--ask", "--ask-timeout", value, "--", "true",
                     cwd=workdir)
    assert proc.returncode == 2 and b"--ask-timeout" in proc.stderr
    async with connect(snappy_dshd.socket) as c:
        assert await c.list_sessions() == []  # nothing was made


async def test_policy_that_is_not_one_names_the_choices(snappy_dshd, workdir):
    sid = await _session(snappy_dshd, workdir)
    proc = await dsh(snappy_dshd.socket, "policy", sid, "always")
    err = proc.stderr.decode()
    assert proc.returncode == 2
    assert "'always' is not an approval policy: choose ask" in err and "or never" in err
    assert "--allow-for-session" in err and "--rules" in err
    proc = await dsh(snappy_dshd.socket, "policy", sid, "never")
    assert proc.returncode == 0
    proc = await dsh(snappy_dshd.socket, "policy", sid, "never", "--rules")
    assert proc.returncode == 2 and b"give one of" in proc.stderr


async def test_approve_with_no_arguments_decides_the_one_request_of_this_directory(
        snappy_dshd, workdir):
    daemon = snappy_dshd
    async with connect(daemon.socket) as c:
        sid = await c.create_session(workdir, approval_policy="ask", name="build")
    run = await _asked(daemon, sid, "n1", "echo by name")
    try:
        aid = await _pending_id(daemon, "n1")
        proc = await dsh(daemon.socket, "approvals")
        row = proc.stdout.decode().splitlines()[1].split()
        assert row[:2] == ["build", aid]  # the session's name, when it has one
        proc = await dsh(daemon.socket, "approve", "--allow-for-session", cwd=workdir)
        assert proc.returncode == 0, proc.stderr
        assert re.fullmatch(r"allowed for the session by rule r-\w+ \(exact command\)\n",
                            proc.stdout.decode()), proc.stdout
        err = proc.stderr.decode()
        assert f"dsh: using session {sid} (build), the newest in" in err
        assert f"dsh: approval {aid}: echo by name" in err
        assert await run.wait() == 0
    finally:
        run.kill()
    proc = await dsh(daemon.socket, "--json", "policy", "build", "--rules")
    [rule] = json.loads(proc.stdout)["rules"]
    assert (rule["kind"], rule["command"]) == ("exact", "echo by name")
    proc = await dsh(daemon.socket, "approve", cwd=workdir)  # nothing waits there now
    # Exit 1 as its help says, without a Usage banner (issue 15 item 4).
    assert proc.returncode == 1 and b"no approval is pending in session" in proc.stderr
    assert b"Usage:" not in proc.stderr
    assert "nothing is pending" in (await dsh(daemon.socket, "approve", "--help")).stdout.decode()


async def _run_env_no_wait(daemon, sid: str, command: str, call_id: str, env: dict):
    """``dsh run --ask --ask-timeout 0 --env K=V...``: only a rule could allow it."""
    pairs = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
    return await dsh(daemon.socket, "run", "--ask", "--ask-timeout", "0", "--session", sid,
                     "--call-id", call_id, *pairs, "--", command)


async def test_a_call_with_its_own_env_never_matches_a_rule_and_the_ask_shows_the_env(
        snappy_dshd, workdir):
    """bash -c expands BASH_ENV: a rule made for ``echo hello`` must not run it with one."""
    daemon = snappy_dshd
    sid = await _session(daemon, workdir)
    await _make_prefix_rule(daemon, sid, "echo hello", "echo hello first")
    evil = {"BASH_ENV": "$(touch pwned)"}
    proc = await _run_env_no_wait(daemon, sid, "echo hello", "v1", evil)
    assert proc.returncode == 125 and b"APPROVAL_UNAVAILABLE" in proc.stderr, proc.stderr
    assert not (workdir / "pwned").exists()
    run = await Live(Path(tempfile.mkdtemp(prefix="dsh-rl-", dir="/tmp")), "v2").start(
        daemon.socket, "run", "--ask", "--ask-timeout", "30", "--session", sid, "--call-id",
        "v2", "--env", "BASH_ENV=$(touch pwned)", "--env", "A=b c", "--", "echo hello")
    try:
        aid = await _pending_id(daemon, "v2")
        proc = await dsh(daemon.socket, "approvals", "--json")
        [shown] = [p for p in json.loads(proc.stdout)["approvals"] if p["approvalId"] == aid]
        assert shown["summary"] == "BASH_ENV='$(touch pwned)' A='b c' echo hello"
        proc = await dsh(daemon.socket, "approve", aid, "--allow-for-session", "--prefix",
                         "echo hello")
        assert proc.returncode == 1 and b"env" in proc.stderr, proc.stderr  # no rule from it
        assert (await dsh(daemon.socket, "approve", aid, "--reject")).returncode == 0
        assert await run.wait() == 125
    finally:
        run.kill()
    asked = [e for e in await _decisions(daemon, sid)
             if e["type"] == "approval/asked" and e["callId"] == "v1"]
    assert asked[0]["summary"] == "BASH_ENV='$(touch pwned)' echo hello"
    # the same command without an env is still allowed by the rule
    proc = await _run_no_wait(daemon, sid, "echo hello again", "v3")
    assert (proc.returncode, proc.stdout) == (0, b"hello again\n"), proc.stderr


async def test_a_rule_does_not_outlive_a_looser_sandbox(snappy_dshd, workdir):
    daemon = snappy_dshd
    async with connect(daemon.socket) as c:
        sid = await c.create_session(workdir, approval_policy="ask", sandbox="workspace-write")
    rule_id = await _make_prefix_rule(daemon, sid, "echo boxed", "echo boxed 0")
    [rule] = [e for e in await _decisions(daemon, sid) if e["type"] == "approval/rule"]
    assert (rule["ruleId"], rule["sandbox"]) == (rule_id, "workspace-write")
    async with connect(daemon.socket) as c:
        await c.set_sandbox(sid, "danger-full-access")
    proc = await _run_no_wait(daemon, sid, "echo boxed 1", "b1")
    assert proc.returncode == 125 and b"APPROVAL_UNAVAILABLE" in proc.stderr, proc.stderr
    async with connect(daemon.socket) as c:
        await c.set_sandbox(sid, "read-only")  # stricter than the rule's: it applies
    proc = await _run_no_wait(daemon, sid, "echo boxed 2", "b2")
    assert (proc.returncode, proc.stdout) == (0, b"boxed 2\n"), proc.stderr


async def test_a_huge_command_under_a_prefix_rule_is_asked_and_the_daemon_stays_live(
        snappy_dshd, workdir):
    """shlex is quadratic in a word's length: a 1 MB word must not be lexed on the loop."""
    daemon = snappy_dshd
    sid = await _session(daemon, workdir)
    await _make_prefix_rule(daemon, sid, "echo big", "echo big 0")
    async with connect(daemon.socket) as c, connect(daemon.socket) as probe:
        huge = "echo big " + "a" * 1_000_000
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: c.start_tool(sid, huge, call_id="g1", approved=False))
            await trio.sleep(0.2)
            with trio.fail_after(5):  # a generous liveness bound
                for _ in range(3):
                    await probe.status()
        result = await c.wait(sid, "g1", timeout=LIVENESS)
        assert result.error_code == "APPROVAL_UNAVAILABLE", result


async def test_set_sandbox_is_audited_with_its_caller(snappy_dshd, workdir):
    daemon = snappy_dshd
    sid = await _session(daemon, workdir)
    async with connect(daemon.socket) as c:
        await c.set_sandbox(sid, "read-only")
    async with connect(daemon.socket) as c:
        events = [json.loads(bytes(raw)) async for raw in c.iter_records(sid)]
    modes = [e["data"] for e in events if e["type"] == "sandbox/mode"]
    assert modes[-1] == {"mode": "read-only", "source": "session.setSandbox", "by": os.getuid()}
    with trio.fail_after(LIVENESS):
        while "session.sandbox_changed" not in daemon.log_path.read_text(errors="replace"):
            await trio.sleep(0.05)
    [line] = [ln for ln in daemon.log_path.read_text().splitlines()
              if "session.sandbox_changed" in ln]
    assert sid in line and "workspace-write" in line and "read-only" in line
    assert str(os.getuid()) in line
