"""The restart path against hostile or damaged call directories (HOST.md §7): what a daemon
finds in ``calls/<callId>/`` at its start is trusted only as far as it can be checked.

A real ``python -m dshd`` (``e2e.spawn_rpc.Daemon``), real call hosts; the damage is done to the
files between a stop and the next start, as an attacker with write access to the state
directory, a crash or a reboot would leave them. Every case ends with the other calls and
sessions still answering.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import trio

from dshd.callhost import tree
from dshd.execution import hostlink
from dshd.execution.hosted import HostStartError, connect
from tests.callhost.helpers import token_carriers

from .test_restart import (
    LIVENESS, call_dir, host_alive, host_json, output_reaches, restartable, start_loop,  # noqa: F401
    stopped_with_dead_host, wait_for, work,  # noqa: F401
)


def test_a_host_json_naming_a_live_process_that_is_no_call_host_is_never_signalled(
        restartable, work):
    """pid and the real startTime of an unrelated process (here pid 1's would do as well), and
    a token variable that every process of the user carries: neither the process nor the
    user's other processes are signalled, and the call is unknown."""
    d = restartable()
    sid, cid, record = stopped_with_dead_host(d, work, "1")
    env = {**os.environ, "DSH_FORGED": "x"}
    stranger = subprocess.Popen(["sleep", "300"], env=env)
    bystander = subprocess.Popen(["sleep", "300"], env=env)
    try:
        st = tree.proc_stat(stranger.pid)
        assert st is not None
        forged = {**record, "pid": stranger.pid, "startTime": st.start_time,
                  "commandPid": bystander.pid, "tokenVar": "DSH_FORGED", "token": "x"}
        (call_dir(d, sid, cid) / "host.json").write_text(json.dumps(forged))
        d.start()
        rpc = d.rpc()
        result = rpc.wait(sid, cid, timeout=LIVENESS)
        assert result["errorCode"] == "TOOL_OUTCOME_UNKNOWN", result
        assert stranger.poll() is None and bystander.poll() is None, "a stranger was signalled"
        # A forged record with the real token variable: the process is no call host.
        assert not hostlink.host_alive({**record, "pid": stranger.pid,
                                        "startTime": st.start_time})
        assert not hostlink.host_alive({**record, "pid": 1,
                                        "startTime": tree.proc_stat(1).start_time})
        other = rpc.session(work)
        assert rpc.run(other, "echo still")["content"] == "still\n"
    finally:
        for p in (stranger, bystander):
            p.kill()
            p.wait()


def test_a_host_of_an_earlier_boot_is_not_alive(tmp_path):
    """Same pid, same startTime, another boot (``bootId``): not this call's host."""
    me = tree.proc_stat(os.getpid())
    record = {"pid": os.getpid(), "startTime": me.start_time, "bootId": "not-this-boot"}
    assert not hostlink.host_alive(record)


@pytest.mark.parametrize("name", ["host.json", "exit.json"])
@pytest.mark.parametrize("kind", ["fifo", "zero", "huge", "other-owner"])
def test_a_record_that_is_no_small_regular_file_of_ours_is_no_record(tmp_path, name, kind):
    """A FIFO (would block the start-up scan forever), ``/dev/zero`` behind a symlink (would
    exhaust memory), a file past the bound, or one another user owns: read as missing, at
    once."""
    directory = tmp_path / "call"
    directory.mkdir()
    path = directory / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        path.write_text(json.dumps({"pid": 5, "pad": "x" * (hostlink.RECORD_MAX + 1)}))
    else:
        path.write_text(json.dumps({"pid": 5, "startTime": 1, "exitCode": 0}))
        os.chown(path, 65534, 65534)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(
        (hostlink.host_record if name == "host.json" else hostlink.record_on_disk)(directory)),
        daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), f"reading a {kind} {name} blocked"
    assert got == [None]


@pytest.mark.parametrize("record", [
    {"exitCode": "zz"}, {"exitCode": 2 ** 70}, {"exitCode": True}, {"totalBytes": -1},
    {"totalBytes": 10, "firstOffset": 11}, {"totalLines": 2 ** 60},
])
def test_a_malformed_exit_record_is_no_record(tmp_path, record):
    (tmp_path / "exit.json").write_text(json.dumps({"version": 1, "exitCode": 0,
                                                    "totalBytes": 0, **record}))
    assert hostlink.record_on_disk(tmp_path) is None


@pytest.mark.parametrize("fields", [
    {"tokenVar": "USER"}, {"token": "atk"}, {"pid": 0}, {"pid": "1"}, {"uid": -1},
])
def test_a_host_record_with_forged_identity_fields_is_no_record(tmp_path, fields):
    good = {"pid": 4242, "startTime": 1, "tokenVar": "DSH_RUN", "token": "0" * 32, "uid": 0}
    (tmp_path / "host.json").write_text(json.dumps(good))
    assert hostlink.host_record(tmp_path) == good
    (tmp_path / "host.json").write_text(json.dumps({**good, **fields}))
    assert hostlink.host_record(tmp_path) is None


def test_an_exit_record_claiming_more_bytes_than_the_log_settles(restartable, work):
    """``totalBytes`` far past the log: the call settles from what the log holds (before:
    it waited for bytes nobody writes, holding a call slot)."""
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = rpc.start(sid, "echo one; sleep 3; echo two; exit 4")
    wait_for(lambda: output_reaches(rpc, sid, cid, "one"), "the call printed one")
    rpc.close()
    assert d.stop(signal.SIGTERM) == 0
    directory = call_dir(d, sid, cid)
    wait_for(lambda: hostlink.record_on_disk(directory), "the host wrote exit.json")
    record = json.loads((directory / "exit.json").read_text())
    (directory / "exit.json").write_text(json.dumps({**record, "totalBytes": 10 ** 12}))
    d.start()
    result = d.rpc().wait(sid, cid, timeout=LIVENESS)
    assert result["exitCode"] == 4 and result["content"] == "one\ntwo\n", result


def test_a_host_killed_while_dshd_was_down_leaves_no_command_running(restartable, work):
    """Unconfined (no pid namespace to take it down): the command, a background child and a
    ``setsid`` one still carry the run's token when the next daemon starts; it ends them and
    the call is unknown."""
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work, sandbox="danger-full-access")
    cid = rpc.start(sid, "(setsid sleep 300 &); sleep 200 & "
                         "while :; do echo tick >> ticks; sleep 0.2; done")
    wait_for(lambda: (work / "ticks").exists(), "the command ticks")
    record = host_json(d, sid, cid)
    rpc.close()
    assert d.stop(signal.SIGTERM) == 0
    os.kill(record["pid"], signal.SIGKILL)
    wait_for(lambda: not host_alive(record), "the host is gone")
    wait_for(lambda: len(token_carriers(record["token"])) >= 3, "the orphans run on")
    d.start()
    result = d.rpc().wait(sid, cid, timeout=LIVENESS)
    assert result["errorCode"] == "TOOL_OUTCOME_UNKNOWN", result
    wait_for(lambda: token_carriers(record["token"]) == [], "no process of the call is left")


def test_a_symlinked_call_dir_is_neither_read_nor_written_through(restartable, work, tmp_path):
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work)
    assert rpc.run(sid, "true")["exitCode"] == 0
    rpc.close()
    assert d.stop(signal.SIGTERM) == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (d.state_dir / "sessions" / sid / "calls" / "extra").symlink_to(outside)
    d.start()
    rpc = d.rpc()
    assert rpc.run(sid, "echo after")["content"] == "after\n"
    assert list(outside.iterdir()) == [], "the daemon wrote through a symlinked call dir"


async def test_a_host_that_never_answers_its_hello_is_refused(tmp_path, autojump_clock):
    """A host that accepts and never answers (SIGSTOPped, hung, or no host at all): a clear
    refusal within the start bound (before: UnboundLocalError, and the host was never
    abandoned)."""
    directory = tmp_path / "call"
    directory.mkdir()
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(directory / "control.sock"))
    listener.listen(1)
    spec = {"dir": str(directory), "secret": "s", "tty": None, "stdin": "null",
            "segment_bytes": 4096}
    with pytest.raises(HostStartError, match="did not answer its hello"):
        await connect({"pid": 4242, "control": "control.sock"}, spec)
    listener.close()
