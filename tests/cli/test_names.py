"""Session names and references through the real ``dsh`` against a real dshd (issue 15 item 1):
names (unique per owner, durable), exact ids, unique prefixes, AMBIGUOUS with candidates, and
the newest session of the current directory when no session is given."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time

import anyio
import pytest

from client.api import connect
from protocol.rpc import INVALID_PARAMS, SESSION_NOT_FOUND, RpcError

from .names_support import daemon, listed, run_in, workdir  # noqa: F401 - fixtures


def _info(d, sid: str) -> dict:
    [info] = [s for s in listed(d) if s["sessionId"] == sid]
    return info


async def test_rename_then_every_command_takes_the_name_or_a_prefix(daemon, workdir):
    sid = run_in(daemon, workdir, "--", "echo", "hello")
    r = daemon.dsh("rename", sid[:-3], "build")  # a unique prefix of the id
    assert r.returncode == 0, r.stderr
    assert f"dsh: {sid[:-3]} matched {sid}" in r.stderr
    assert _info(daemon, sid)["name"] == "build"
    log = daemon.dsh("log", "build", "--json")
    assert log.returncode == 0, log.stderr
    assert "tool/result" in {json.loads(line)["type"] for line in log.stdout.splitlines()}
    assert "matched" not in log.stderr and "using session" not in log.stderr  # exact name
    r = daemon.dsh("log", "bui")  # a prefix of the name
    assert r.returncode == 0 and f"dsh: bui matched {sid} (build)" in r.stderr, r.stderr
    assert "build" in daemon.dsh("sessions").stdout
    r = daemon.dsh("--json", "rename", "build", "--clear")
    assert r.returncode == 0 and json.loads(r.stdout) == {"sessionId": sid, "name": None}
    assert _info(daemon, sid)["name"] is None
    assert daemon.dsh("log", "build").returncode == 1


async def test_a_taken_name_is_refused_with_its_holder(daemon, workdir):
    first = run_in(daemon, workdir, "--", "true")
    second = run_in(daemon, workdir, "--", "true")
    assert daemon.dsh("rename", first, "build").returncode == 0
    r = daemon.dsh("rename", second, "build")
    assert r.returncode == 1 and f"taken by session {first}" in r.stderr, r.stderr
    assert _info(daemon, second)["name"] is None
    async with connect(daemon.socket) as c:
        with pytest.raises(RpcError) as err:
            await c.create_session(str(workdir), name="build")
        assert err.value.code == INVALID_PARAMS
        assert err.value.data == {"code": "NAME_TAKEN", "field": "name", "sessionId": first}
        named = await c.create_session(str(workdir), name="test")
        assert (await c.find_session("test")) == (named, "name")
        with pytest.raises(RpcError) as err:
            await c.create_session(str(workdir), name="-bad")
        assert err.value.code == INVALID_PARAMS and "name" in err.value.message
    bad = daemon.dsh("rename", second, "no/slash")
    assert bad.returncode == 2 and "not a session name" in bad.stderr


async def test_concurrent_creates_with_one_name_give_it_to_one(daemon, workdir):
    won: list[str] = []
    lost: list[dict] = []

    async def create() -> None:
        async with connect(daemon.socket) as c:
            try:
                won.append(await c.create_session(str(workdir), name="race"))
            except RpcError as exc:
                lost.append(exc.data)

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(create)
    assert len(won) == 1 and len(lost) == 5
    assert all(d["code"] == "NAME_TAKEN" and d["sessionId"] == won[0] for d in lost)


async def test_an_ambiguous_prefix_lists_the_candidates(daemon, workdir):
    async with connect(daemon.socket) as c:
        ids = [await c.create_session(str(workdir)) for _ in range(3)]
        common = ids[0]
        while not all(i.startswith(common) for i in ids):
            common = common[:-1]
        assert common  # minted ids are time-ordered: these share their first chars
        with pytest.raises(RpcError) as err:
            await c.find_session(common)
        assert err.value.code == SESSION_NOT_FOUND and err.value.data["code"] == "AMBIGUOUS"
        assert {x["sessionId"] for x in err.value.data["candidates"]} == set(ids)
        assert (await c.find_session(ids[1])) == (ids[1], "id")
    r = daemon.dsh("log", common)
    assert r.returncode == 1 and "matches 3 sessions" in r.stderr, r.stderr
    assert all(i in r.stderr for i in ids)


async def test_no_session_means_the_newest_of_this_directory(daemon, workdir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    older = run_in(daemon, workdir, "--", "echo", "older")
    elsewhere = run_in(daemon, other, "--", "echo", "elsewhere")
    newest = run_in(daemon, workdir, "--call-id", "c1", "--", "echo", "newest")
    assert len({older, elsewhere, newest}) == 3
    r = daemon.dsh("log", "--json", cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    assert f"dsh: using session {newest}, the newest in {workdir}" in r.stderr
    assert any('"newest' in line for line in r.stdout.splitlines())
    r = daemon.dsh("wait", "c1", cwd=str(workdir))
    assert r.returncode == 0 and r.stdout == "newest\n", r.stderr
    assert f"using session {newest}" in r.stderr
    r = daemon.dsh("attach", cwd=str(workdir))
    assert r.returncode == 0 and f"using session {newest}" in r.stderr, r.stderr
    # New activity in the older session makes it the newest.
    assert daemon.dsh("run", "--session", older, "--", "true", cwd=str(workdir)).returncode == 0
    r = daemon.dsh("log", cwd=str(workdir))
    assert f"using session {older}" in r.stderr, r.stderr
    r = daemon.dsh("log", cwd=str(other))
    assert f"using session {elsewhere}" in r.stderr, r.stderr


async def test_a_directory_without_sessions_says_what_to_pass(daemon, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (("log",), ("attach",), ("wait", "somecall")):
        r = daemon.dsh(*args, cwd=str(empty))
        assert r.returncode == 1, (args, r.stderr)
        [line] = r.stderr.splitlines()
        assert f"no session works in {empty}" in line and "name one" in line


async def test_names_survive_a_restart_and_a_removed_session_frees_its_name(daemon, workdir):
    keep = run_in(daemon, workdir, "--", "true")
    gone = run_in(daemon, workdir, "--", "true")
    assert daemon.dsh("rename", keep, "keep").returncode == 0
    assert daemon.dsh("rename", gone, "gone").returncode == 0
    daemon.stop()
    shutil.rmtree(daemon.state_dir / "sessions" / gone)  # what a delete leaves: no directory
    daemon.start()
    assert _info(daemon, keep)["name"] == "keep"  # a closed session: from its summary
    r = daemon.dsh("log", "keep")
    assert r.returncode == 0, r.stderr
    r = daemon.dsh("rename", keep, "gone")
    assert r.returncode == 0, r.stderr
    assert _info(daemon, keep)["name"] == "gone"


def test_completion_lists_names_and_ids_and_never_fails(daemon, workdir, tmp_path):
    sid = run_in(daemon, workdir, "--", "true")
    assert daemon.dsh("rename", sid, "build").returncode == 0

    def complete(words: str, env: dict) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*daemon.dsh_argv()], env={**env, "_DSH_COMPLETE": "bash_complete",
                                       "COMP_WORDS": words,
                                       "COMP_CWORD": str(len(words.split()) - 1)},
            capture_output=True, text=True, timeout=30)

    r = complete("dsh log b", daemon.env)
    assert r.returncode == 0 and "plain,build" in r.stdout.splitlines(), r.stdout
    r = complete(f"dsh log {sid[:4]}", daemon.env)
    assert f"plain,{sid}" in r.stdout.splitlines(), r.stdout
    dead = {**daemon.env, "DSH_SOCKET": str(tmp_path / "no.sock")}
    r = complete("dsh log b", dead)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr == ""
    # A daemon that accepts but never answers: completion gives up (well within 10 s).
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(tmp_path / "mute.sock"))
    mute.listen(8)
    try:
        started = time.monotonic()
        r = complete("dsh log b", {**daemon.env, "DSH_SOCKET": str(tmp_path / "mute.sock")})
        assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr == ""
        assert time.monotonic() - started < 10
    finally:
        mute.close()
