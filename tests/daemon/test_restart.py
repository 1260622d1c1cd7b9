"""Tool calls survive a daemon restart (issue 13; HOST.md §7): a real ``python -m dshd`` on a
real socket, real call hosts, the real sandbox (bwrap where the machine has it, as every
confined call of the suite), spoken to with a raw JSON-RPC client.

Each test restarts its daemon with ``stop()`` (SIGTERM) or ``kill9()`` and ``start()``, and
ends it with ``close()``, which also ends every call host it left (hosts outlive daemons).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dshd.callhost import tree
from dshd.storage.reader import read_log
from e2e.spawn_rpc import Daemon, Rpc

#: Liveness bound of every wait here (seconds): generous, never a speed target.
LIVENESS = 60.0

LOOP = ("for i in $(seq 1 {n}); do echo $i; echo $i >> {marks}; sleep {pause}; done; "
        "exit {code}")


@pytest.fixture
def restartable(tmp_path):
    """A factory of daemons in ``tmp_path`` (config TOML text); each one is closed at the end."""
    made: list[Daemon] = []

    def make(config: str = "") -> Daemon:
        root = tmp_path / f"d{len(made)}"
        root.mkdir()
        d = Daemon(config, root=root)
        made.append(d)
        d.start()
        return d

    yield make
    for d in made:
        d.close()


@pytest.fixture
def work(tmp_path) -> Path:
    w = tmp_path / "work"
    w.mkdir()
    return w


class Answerer(Rpc):
    """A raw client that says ``capabilities.approvals`` (an approval answerer)."""

    def __init__(self, path: Path, timeout: float = 120.0) -> None:
        import socket

        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.next_id = 0
        self.server = self.result("initialize", {"protocolVersion": 1,
                                                 "capabilities": {"approvals": True}})


def wait_for(predicate, what: str, seconds: float = LIVENESS):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds:g} s: {what}")


def call_dir(d: Daemon, sid: str, cid: str) -> Path:
    return d.state_dir / "sessions" / sid / "calls" / cid


def host_json(d: Daemon, sid: str, cid: str) -> dict:
    return json.loads((call_dir(d, sid, cid) / "host.json").read_text())


def host_alive(record: dict) -> bool:
    st = tree.proc_stat(record["pid"])
    return st is not None and st.start_time == record["startTime"]


def logged(d: Daemon, sid: str) -> list:
    """The session's events as the file holds them (read-only, no daemon asked)."""
    return read_log(d.state_dir / "sessions" / sid, sid).events


def results_of(d: Daemon, sid: str, cid: str) -> list[dict]:
    return [ev.data for ev in logged(d, sid) if ev.type == "tool/result"
            and ev.data.get("callId") == cid]


def read_all(rpc: Rpc, sid: str, cid: str) -> bytes:
    out, offset = b"", 0
    while True:
        r = rpc.result("tool.read", {"sessionId": sid, "callId": cid, "offset": offset})
        data = base64.b64decode(r["data"])
        out += data
        offset += len(data)
        if r["eof"] and offset >= r["endOffset"]:
            return out
        if not data:
            time.sleep(0.05)


def start_loop(rpc: Rpc, sid: str, work: Path, n: int, code: int, pause: float = 0.5) -> str:
    return rpc.start(sid, LOOP.format(n=n, marks=work / "marks", pause=pause, code=code))


def output_reaches(rpc: Rpc, sid: str, cid: str, line: str) -> bool:
    r = rpc.result("tool.read", {"sessionId": sid, "callId": cid, "offset": 0})
    return f"\n{line}\n" in "\n" + base64.b64decode(r["data"]).decode()


def stopped_with_dead_host(d: Daemon, work: Path, printed: str) -> tuple[str, str, dict]:
    """A loop call that has printed ``printed``, the daemon stopped (detach), then its host
    SIGKILLed while no daemon runs and the command's processes ended as an operator would
    (Landlock and none leave them running a moment): ``(sid, cid, host.json)``."""
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = start_loop(rpc, sid, work, n=400, code=0, pause=0.2)
    wait_for(lambda: output_reaches(rpc, sid, cid, printed), f"the loop printed {printed}")
    record = host_json(d, sid, cid)
    rpc.close()
    assert d.stop(signal.SIGTERM) == 0
    os.kill(record["pid"], signal.SIGKILL)
    wait_for(lambda: not host_alive(record), "the host is gone")
    tree.kill_tree(-1, None, None, f"{record['tokenVar']}={record['token']}", os.geteuid())
    return sid, cid, record


def restart(d: Daemon, how: str) -> None:
    if how == "sigterm":
        assert d.stop(signal.SIGTERM) == 0
    else:
        d.kill9()
    d.start()


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_a_running_call_is_adopted_after_a_restart(restartable, work, how):
    """Stop (SIGTERM: on_stop = "detach", the default) or kill -9 the daemon while a loop runs:
    the host runs on, nothing is recorded for the call; after the start the call is running
    again, ``tool.wait`` gives its real exit code and ``tool.read`` every byte once."""
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = start_loop(rpc, sid, work, n=12, code=7)
    wait_for(lambda: output_reaches(rpc, sid, cid, "2"), "the loop printed 2")
    record = host_json(d, sid, cid)
    rpc.close()
    if how == "sigterm":
        assert d.stop(signal.SIGTERM) == 0
    else:
        d.kill9()
    assert host_alive(record), "the call host must outlive the daemon"
    assert results_of(d, sid, cid) == [], "a detached call has no tool/result"
    assert not (call_dir(d, sid, cid) / "settled").exists()
    d.start()
    rpc = d.rpc()
    info = rpc.result("session.get", {"sessionId": sid})
    assert info["running"] == 1, info
    result = rpc.wait(sid, cid)
    assert result["exitCode"] == 7 and "errorCode" not in result, result
    expected = "".join(f"{i}\n" for i in range(1, 13))
    assert read_all(rpc, sid, cid).decode() == expected
    assert result["content"] == expected
    assert (work / "marks").read_text() == expected, "the command ran once, start to end"
    assert len(results_of(d, sid, cid)) == 1
    wait_for(lambda: (call_dir(d, sid, cid) / "settled").exists(), "the settled marker")
    wait_for(lambda: not host_alive(record), "the host exits once released")


def test_the_start_opens_sessions_with_unsettled_calls_before_any_request(restartable, work):
    """No client names the session after the restart: the daemon's start opened it (its call
    dir had no ``settled`` marker), re-adopted the call, and recorded its result."""
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = start_loop(rpc, sid, work, n=4, code=5)
    wait_for(lambda: output_reaches(rpc, sid, cid, "1"), "the loop printed 1")
    rpc.close()
    assert d.stop(signal.SIGTERM) == 0
    d.start()
    result = wait_for(lambda: results_of(d, sid, cid), "the adopted call's result on disk")
    assert result[0]["exitCode"] == 5 and "errorCode" not in result[0], result


def test_a_host_that_ended_while_the_daemon_was_down_settles_from_exit_json(restartable, work):
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = start_loop(rpc, sid, work, n=3, code=3, pause=0.3)
    wait_for(lambda: output_reaches(rpc, sid, cid, "1"), "the loop printed 1")
    rpc.close()
    assert d.stop(signal.SIGTERM) == 0
    wait_for(lambda: (call_dir(d, sid, cid) / "exit.json").exists(), "exit.json")
    d.start()
    rpc = d.rpc()
    result = rpc.wait(sid, cid)
    assert result["exitCode"] == 3 and result["isError"], result
    assert "errorCode" not in result, result
    assert "dshd was not running when the command ended" in result["message"], result
    assert result["content"] == "1\n2\n3\n"


def test_a_command_that_ended_after_the_start_has_no_while_down_note(restartable, work):
    """The note says dshd was not running when the command ended only when its ``endedAt`` is
    before this daemon started. Two sessions' commands wait for a gate the test opens after the
    restart, under ``max_sessions = 1``: the first id's session opens at the start and re-adopts
    its host; the other opens only when asked, after its command ended (it is settled from
    ``exit.json``, as a call that ended while no daemon ran would be). Neither result has the
    note: dshd was running when both ended (CI saw it on a call re-adopted just after it ended)."""
    d = restartable()
    rpc = d.rpc()
    calls, names = {}, {}
    for name in ("a", "b"):
        sid = rpc.session(work)
        names[sid] = name
        calls[sid] = rpc.start(sid, f"echo {name} >> {work / 'started'}; "
                                    f"while [ ! -e {work / 'go'} ]; do sleep 0.05; done; "
                                    f"echo {name}; exit 4")
    wait_for(lambda: (work / "started").exists()
             and len((work / "started").read_text().split()) == 2, "both commands started")
    rpc.close()
    assert d.stop(signal.SIGTERM) == 0
    (d.root / "dshd.toml").write_text("max_sessions = 1\n")
    d.start()
    (work / "go").write_text("")
    rpc = d.rpc()
    first, later = sorted(calls)
    for sid in (first, later):  # the first settles before the later one may open (the bound)
        cid = calls[sid]
        if sid == later:
            wait_for(lambda: (call_dir(d, sid, cid) / "exit.json").exists(), "exit.json")
        result = rpc.wait(sid, cid)
        assert result["exitCode"] == 4 and "errorCode" not in result, result
        assert "not running" not in result.get("message", ""), result
        assert result["content"] == f"{names[sid]}\n", result


@pytest.mark.parametrize("sidecar", ["kept", "lost"])
def test_a_host_killed_while_the_daemon_was_down_is_outcome_unknown(restartable, work, sidecar):
    """The host died too (kill -9 while no daemon ran): ``TOOL_OUTCOME_UNKNOWN`` with the last
    window -- the pending-output sidecar's, or without one the tail of the call's own log."""
    d = restartable()
    sid, cid, _ = stopped_with_dead_host(d, work, "3")
    if sidecar == "lost":
        (d.state_dir / "sessions" / sid / "pending" / f"{cid}.ops.jsonl").unlink(missing_ok=True)
    d.start()
    rpc = d.rpc()
    result = rpc.wait(sid, cid)
    assert result["errorCode"] == "TOOL_OUTCOME_UNKNOWN", result
    assert "last output" in result["content"] and "\n3\n" in result["content"], result


def test_an_adopted_call_whose_host_dies_settles_at_once(restartable, work):
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = start_loop(rpc, sid, work, n=200, code=0, pause=0.2)
    wait_for(lambda: output_reaches(rpc, sid, cid, "2"), "the loop printed 2")
    rpc.close()
    restart(d, "sigterm")
    rpc = d.rpc()
    assert rpc.result("session.get", {"sessionId": sid})["running"] == 1
    record = host_json(d, sid, cid)
    os.kill(record["pid"], signal.SIGKILL)
    result = rpc.wait(sid, cid, timeout=LIVENESS)
    assert result.get("errorCode") == "TOOL_FAILED", result
    assert f"call host (pid {record['pid']}) died" in result["message"], result


def test_a_stale_host_json_with_a_reused_pid_is_never_adopted(restartable, work):
    """``host.json`` names a pid that now belongs to an unrelated live process (its
    ``startTime`` differs): the call is not adopted (TOOL_OUTCOME_UNKNOWN) and the unrelated
    process is left alone."""
    d = restartable()
    sid, cid, record = stopped_with_dead_host(d, work, "1")
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        path = call_dir(d, sid, cid) / "host.json"
        path.write_text(json.dumps({**record, "pid": stranger.pid}))
        d.start()
        rpc = d.rpc()
        result = rpc.wait(sid, cid)
        assert result["errorCode"] == "TOOL_OUTCOME_UNKNOWN", result
        assert stranger.poll() is None, "an unrelated process was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_on_stop_cancel_keeps_the_old_stop(restartable, work):
    d = restartable('on_stop = "cancel"\n')
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = start_loop(rpc, sid, work, n=200, code=0, pause=0.2)
    wait_for(lambda: output_reaches(rpc, sid, cid, "1"), "the loop printed 1")
    record = host_json(d, sid, cid)
    rpc.close()
    assert d.stop(signal.SIGTERM) == 0
    [result] = results_of(d, sid, cid)
    assert result["errorCode"] == "TOOL_CANCELLED", result
    wait_for(lambda: not host_alive(record), "the host ends with the call")
    d.start()
    rpc = d.rpc()
    assert rpc.wait(sid, cid)["errorCode"] == "TOOL_CANCELLED"


def test_a_detaching_stop_leaves_a_pending_approval_undecided(restartable, work):
    """A call waiting for approval at a detaching stop: no ``cancelled`` decision and no
    result are recorded; after the start the approval is not closed by repair (it is asked
    again, HOST.md §7) and the command never ran before a decision."""
    d = restartable()
    rpc = Answerer(d.socket)
    sid = rpc.session(work, approvalPolicy="ask")
    rpc.result("subscribe", {"sessionId": sid})
    marker = work / "ran"
    cid = rpc.result("tool.run", {"sessionId": sid, "name": "bash",
                                  "arguments": {"command": f"echo x >> {marker}"}})["callId"]
    wait_for(lambda: any(ev.type == "approval/asked" for ev in logged(d, sid)),
             "the approval was asked")
    assert d.stop(signal.SIGTERM) == 0  # the answerer is still attached: a stop, not a leave
    rpc.close()
    types = [ev.type for ev in logged(d, sid)]
    assert "approval/decided" not in types and "tool/result" not in types, types
    d.start()
    rpc = d.rpc()
    events = rpc.events(sid)
    assert not [e for e in events if e["type"] == "approval/decided"
                and e["data"].get("by") == "repair"], events
    # One audit pair per call: the start asks again under the same approval, not a new one.
    assert [e["data"]["callId"] for e in events if e["type"] == "approval/asked"] == [cid]
    assert not marker.exists()


def test_an_old_call_dir_without_a_marker_gets_one(restartable, work):
    """A settled call whose dir has no ``settled`` marker (an older release, a lost write)
    makes the next start open its session once, which writes the marker."""
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = rpc.start(sid, "echo done")
    assert rpc.wait(sid, cid)["exitCode"] == 0
    marker = call_dir(d, sid, cid) / "settled"
    wait_for(marker.exists, "the settled marker")
    rpc.close()
    assert d.stop(signal.SIGTERM) == 0
    marker.unlink()
    d.start()
    wait_for(marker.exists, "the marker written by the start's open")


def test_the_raw_verbs_and_cancel_reach_an_adopted_call(restartable, work):
    """``tool.write``, ``tool.signal``, ``tool.resize`` and ``tool.cancel`` after the restart
    go to the adopted call's host (``Call.host`` is the new handle)."""
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work)
    script = ("trap 'echo got-usr1' USR1; echo ready; read line; echo got:$line; "
              "while :; do sleep 0.1; done")
    cid = rpc.start(sid, script, tty=True)
    wait_for(lambda: output_reaches(rpc, sid, cid, "ready\r"), "ready")
    rpc.close()
    restart(d, "sigterm")
    rpc = d.rpc()
    rpc.result("tool.resize", {"sessionId": sid, "callId": cid, "cols": 100, "rows": 30})
    data = base64.b64encode(b"hello\r").decode()
    rpc.result("tool.write", {"sessionId": sid, "callId": cid, "data": data})
    wait_for(lambda: output_reaches(rpc, sid, cid, "got:hello\r"), "the written line came back")
    rpc.result("tool.signal", {"sessionId": sid, "callId": cid, "signal": "USR1"})
    wait_for(lambda: output_reaches(rpc, sid, cid, "got-usr1\r"), "the signal's trap ran")
    rpc.result("tool.cancel", {"sessionId": sid, "callId": cid})
    result = rpc.wait(sid, cid)
    assert result["errorCode"] == "TOOL_CANCELLED", result


def test_adopted_calls_count_in_the_call_limits(restartable, work):
    d = restartable("max_calls_per_session = 1\n")
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = start_loop(rpc, sid, work, n=200, code=0, pause=0.2)
    wait_for(lambda: output_reaches(rpc, sid, cid, "1"), "the loop printed 1")
    rpc.close()
    restart(d, "kill9")
    rpc = d.rpc()
    refused = rpc.call("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                    "arguments": {"command": "true"}})
    assert refused.get("error", {}).get("code") == -32013, refused
    assert rpc.result("tool.cancel", {"sessionId": sid, "callId": cid})
    assert rpc.wait(sid, cid)["errorCode"] == "TOOL_CANCELLED"


def test_a_follow_after_the_restart_streams_an_adopted_call_to_its_end(restartable, work):
    """``tool.follow`` from a new client after the restart: every byte from offset 0, once,
    in order, then ``eof`` with the real exit code."""
    d = restartable()
    rpc = d.rpc()
    sid = rpc.session(work)
    cid = start_loop(rpc, sid, work, n=10, code=6, pause=0.3)
    wait_for(lambda: output_reaches(rpc, sid, cid, "2"), "the loop printed 2")
    rpc.close()
    restart(d, "kill9")
    rpc = d.rpc()
    follow_id = rpc.result("tool.follow", {"sessionId": sid, "callId": cid})["followId"]
    data, offset, end = b"", 0, None
    deadline = time.monotonic() + LIVENESS
    while end is None:
        assert time.monotonic() < deadline, "the follow did not end"
        msg = json.loads(rpc.file.readline())
        params = msg.get("params") or {}
        if msg.get("method") != "output" or params.get("followId") != follow_id:
            continue
        if "data" in params:
            assert params["offset"] == offset, (params["offset"], offset)
            chunk = base64.b64decode(params["data"])
            data, offset = data + chunk, offset + len(chunk)
        if params.get("eof"):
            end = params
    assert data.decode() == "".join(f"{i}\n" for i in range(1, 11))
    assert end.get("exitCode") == 6, end
