"""The host's life through the real process: terminate, eof_grace, timeout, spawn failure,
host.json and exit.json, descriptors, release and linger."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.callhost import helpers

TREE = """
trap '' TERM
(sh -c 'trap "" TERM; sleep 300' &)
setsid sh -c 'trap "" TERM; sleep 301' &
sh -c 'trap "" TERM; sleep 302' &
echo started
wait
"""


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_bytes().rpartition(b")")[2].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = set(), [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            if helpers.proc_state(pid) not in (None, "Z") and pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def test_terminate_kills_a_tree_with_double_forked_and_setsid_children(hosts):
    run = hosts(["/bin/sh", "-c", TREE])
    run.wait_output(b"started")
    deadline = time.monotonic() + helpers.LIVENESS
    while len(helpers.token_carriers(run.spec["token"])) < 7:  # 4 sh + 3 sleep
        assert time.monotonic() < deadline, helpers.token_carriers(run.spec["token"])
        time.sleep(0.05)
    assert len(_descendants(run.pid)) >= 7  # the subreaper holds the escaped ones too
    conn = run.connect()
    conn.request("attach")
    assert conn.request("terminate", grace=0.5, reason="cancelled")["ok"] is True
    record = conn.next_event("exit")["record"]
    assert record["reason"] == "cancelled" and record["signal"] == 9, record
    assert record["exitCode"] == 137
    assert helpers.token_carriers(run.spec["token"]) == []
    assert _descendants(run.pid) == set()


def test_a_background_child_left_holding_the_output_dies_after_eof_grace(hosts):
    run = hosts(["/bin/sh", "-c", "sleep 30 & echo bg=$!"], eof_grace=0.5)
    record = run.wait_record()
    assert record["exitCode"] == 0 and record["reason"] == "exited", record
    bg = int(run.output().decode().split("bg=")[1])
    helpers.wait_gone(bg, timeout=5)
    assert helpers.token_carriers(run.spec["token"]) == []


def test_a_background_child_that_closed_the_output_dies_too(hosts):
    run = hosts(["/bin/sh", "-c", "nohup sleep 30 >/dev/null 2>&1 & echo bg=$!"], eof_grace=5)
    run.wait_record()
    bg = int(run.output().decode().split("bg=")[1])
    helpers.wait_gone(bg, timeout=5)
    assert helpers.token_carriers(run.spec["token"]) == []


def test_timeout_terminates_with_reason_timeout(hosts):
    run = hosts(["/bin/sleep", "30"], timeout=0.3, kill_grace=5)
    record = run.wait_record()
    assert record["reason"] == "timeout" and record["signal"] == 15, record
    assert record["exitCode"] == 143


def test_a_missing_program_is_a_spawn_failure_record(hosts):
    run = hosts(["/nonexistent/prog", "x"])
    assert run.ready["commandPid"] is None
    record = run.wait_record()
    assert record["reason"] == "spawn-failed" and record["errno"] == "ENOENT", record
    assert "/nonexistent/prog" in record["message"] and record["exitCode"] is None
    assert record["totalBytes"] == 0


def test_a_bad_cwd_is_a_spawn_failure_naming_the_directory(hosts, tmp_path):
    run = hosts(["/bin/true"], cwd=str(tmp_path / "missing"))
    record = run.wait_record()
    assert record["reason"] == "spawn-failed" and record["errno"] == "ENOENT", record
    assert str(tmp_path / "missing") in record["message"]
    assert "working directory" in record["message"]


def test_the_command_runs_as_the_spec_user_and_enters_cwd_as_it(hosts, tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # root may enter it, nobody may not
    run = hosts(["/bin/sh", "-c", "id -u; id -g"], cwd="/",
                user={"uid": 65534, "gid": 65534, "groups": []})
    assert run.wait_record()["exitCode"] == 0
    assert run.output().split() == [b"65534", b"65534"]
    denied = hosts(["/bin/true"], cwd=str(private),
                   user={"uid": 65534, "gid": 65534, "groups": []})
    record = denied.wait_record()
    assert record["reason"] == "spawn-failed" and record["errno"] == "EACCES", record


def test_exit_json_follows_the_log_fsync_and_host_json_matches_proc(tmp_path):
    directory = tmp_path / "call"
    directory.mkdir(mode=0o700)
    spec = helpers.make_spec(directory, ["/bin/sh", "-c", "printf 'a\\nbc'"], linger=0.0)
    trace = tmp_path / "trace"
    with open(directory / "host.log", "wb") as log:
        popen = subprocess.Popen(
            ["strace", "-f", "-qq", "-e", "trace=fsync,rename,openat", "-o", str(trace),
             "--", os.sys.executable, "-I", "-S", helpers.MAIN],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, close_fds=True,
            start_new_session=True)
    popen.stdin.write(json.dumps(spec).encode())
    popen.stdin.close()
    ready = json.loads(popen.stdout.readline())
    host_json = json.loads((directory / "host.json").read_text())
    stat = Path(f"/proc/{ready['pid']}/stat").read_bytes().rpartition(b")")[2].split()
    assert host_json["pid"] == ready["pid"] and host_json["startTime"] == int(stat[19])
    assert host_json["segmentBytes"] == spec["segment_bytes"] and host_json["tty"] is False
    assert host_json["control"] == ready["control"]
    record = helpers.HostRun(directory, spec, ready, popen).wait_record()
    assert record == {**record, "version": 1, "exitCode": 0, "signal": None,
                      "reason": "exited", "totalBytes": 4, "totalLines": 2, "firstOffset": 0}
    assert abs(record["endedAt"] - time.time()) < 60
    helpers.wait_gone(ready["pid"])
    popen.wait(timeout=helpers.LIVENESS)
    time.sleep(0.2)  # strace writes its last lines as the traced process ends
    lines = [line for line in trace.read_text().splitlines() if line.split()[0] == str(ready["pid"])]

    def first(pred) -> int:
        return next(i for i, line in enumerate(lines) if pred(line))

    log_fd = lines[first(lambda x: "output.raw" in x and "openat" in x)].rsplit("=", 1)[1].strip()
    exited = max(i for i, line in enumerate(lines)
                 if "SIGCHLD" in line and f"si_pid={ready['commandPid']}," in line)
    opened = first(lambda x: ".exit.json.tmp" in x and "openat" in x)
    tmp_fd = lines[opened].rsplit("=", 1)[1].strip()
    renamed = first(lambda x: "rename" in x and "exit.json" in x)
    # the log is fsync'd after the command ended (all its output was read) and before the
    # exit record exists; the record's file is fsync'd before the rename, the dir after it
    assert any(f"fsync({log_fd})" in line for line in lines[exited:opened]), lines
    assert any(f"fsync({tmp_fd})" in line for line in lines[opened:renamed]), lines
    assert any("fsync(" in line for line in lines[renamed:]), lines


def test_the_host_holds_no_daemon_descriptor(hosts, tmp_path):
    secret_file = open(tmp_path / "daemon.lock", "wb")  # the "daemon's" own fd, passed on
    run = hosts(["/bin/sleep", "30"], tty={"cols": 80, "rows": 24}, pass_fds=[secret_file.fileno()])
    assert run.popen.stdout.read() == b""  # nobody holds the ready pipe's write end any more
    fds = {fd: os.readlink(f"/proc/{run.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{run.pid}/fd")}
    assert fds["0"] == fds["1"] == "/dev/null", fds
    assert fds["2"] == str(run.dir / "host.log")
    allowed = ("socket:", "pipe:", "anon_inode:[eventpoll]", "/dev/ptmx", str(run.dir / "output.raw"))
    strays = {fd: target for fd, target in fds.items()
              if fd not in ("0", "1", "2") and not target.startswith(allowed)}
    assert strays == {}, fds
    assert str(tmp_path / "daemon.lock") not in fds.values()
    assert sum(t.startswith("socket:") for t in fds.values()) == 1  # the listener only
    conn = run.connect()
    conn.request("terminate", grace=0.2)
    run.wait_record()
    secret_file.close()


def test_the_host_exits_after_release(hosts):
    run = hosts(["/bin/true"])
    run.wait_record()
    conn = run.connect()
    assert conn.request("status")["state"] == "exited"
    assert conn.request("release") == {"id": 2, "ok": True}
    helpers.wait_gone(run.pid)


def test_a_release_before_the_end_is_kept(hosts):
    run = hosts(["/bin/sh", "-c", "sleep 0.5"])
    conn = run.connect()
    assert conn.request("release")["ok"] is True
    assert run.wait_record()["exitCode"] == 0
    helpers.wait_gone(run.pid)


def test_the_host_exits_after_linger_without_release(hosts):
    run = hosts(["/bin/true"], linger=0.5)
    run.wait_record()
    helpers.wait_gone(run.pid)


def test_a_spec_it_cannot_use_is_answered_and_nothing_starts(tmp_path):
    directory = tmp_path / "call"
    directory.mkdir(mode=0o700)
    ready, _ = helpers.run_main(directory, b'{"version": 1, "dir": "relative"}')
    assert ready["ok"] is False and "dir" in ready["error"]
    ready, _ = helpers.run_main(directory, b"not json")
    assert ready["ok"] is False and "JSON" in ready["error"]
    assert sorted(p.name for p in directory.iterdir()) == ["host.log"]
    directory.chmod(0o755)
    spec = helpers.make_spec(directory, ["/bin/true"])
    ready, _ = helpers.run_main(directory, json.dumps(spec).encode())
    assert ready["ok"] is False and "0700" in ready["error"], ready


def test_a_torn_spec_whose_runner_is_gone_leaves_one_line_in_host_log(tmp_path):
    """A daemon killed while it wrote the spec: the host cannot answer either (its stdout's
    reader is gone); host.log says why in one line, not two tracebacks."""
    log_path = tmp_path / "host.log"
    r, w = os.pipe()
    os.close(r)  # the runner's end of the ready pipe: gone
    with open(log_path, "wb") as log:
        proc = subprocess.run([os.sys.executable, "-I", "-S", helpers.MAIN], input=b'{"ver',
                              stdout=w, stderr=log, timeout=30)
    os.close(w)
    text = log_path.read_text()
    assert proc.returncode == 2
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert "not JSON" in text, text


def test_a_log_that_cannot_be_written_stops_the_command_with_a_message(tmp_path):
    directory = tmp_path / "call"
    directory.mkdir(mode=0o700)
    spec = helpers.make_spec(directory, ["/bin/sh", "-c", "exec cat /dev/zero"], linger=0.0,
                             kill_grace=0.5)
    with open(directory / "host.log", "wb") as log:  # files over 1 MiB: EFBIG (SIGXFSZ ignored)
        popen = subprocess.Popen(["prlimit", "--fsize=1048576", "--", os.sys.executable, "-I",
                                  "-S", helpers.MAIN], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=log, close_fds=True,
                                 start_new_session=True)
    popen.stdin.write(json.dumps(spec).encode())
    popen.stdin.close()
    ready = json.loads(popen.stdout.readline())
    run = helpers.HostRun(directory, spec, ready, popen)
    record = run.wait_record()
    assert record["reason"] == "killed" and "output log failed" in record["message"], record
    assert record["totalBytes"] == 1048576 == (directory / "output.raw").stat().st_size
    assert helpers.token_carriers(spec["token"]) == []


def test_pass_fds_reach_the_command_and_leave_the_host(hosts, tmp_path):
    (tmp_path / "script").write_text("echo from-the-fd\n")
    fd = os.open(tmp_path / "script", os.O_RDONLY)
    try:
        run = hosts(["/bin/sh", f"/dev/fd/{fd}"], pass_fds=[fd])
        record = run.wait_record()
    finally:
        os.close(fd)
    assert record["exitCode"] == 0 and run.output() == b"from-the-fd\n"


def test_the_command_starts_with_default_signals_and_an_empty_mask(hosts):
    run = hosts(["/bin/cat", "/proc/self/status"])  # cat changes no disposition
    run.wait_record()
    fields = dict(line.split(":\t", 1) for line in run.output().decode().splitlines()
                  if ":\t" in line)
    assert int(fields["SigIgn"], 16) == 0, fields["SigIgn"]  # SIGPIPE, SIGHUP, SIGINT too
    assert int(fields["SigBlk"], 16) == 0, fields["SigBlk"]


def test_the_log_is_fsynced_at_most_once_a_second_while_output_flows(tmp_path):
    directory = tmp_path / "call"
    directory.mkdir(mode=0o700)
    flow = "for i in $(seq 1 30); do head -c 100000 /dev/zero; sleep 0.1; done"
    spec = helpers.make_spec(directory, ["/bin/sh", "-c", flow], linger=0.0)
    trace = tmp_path / "trace"
    with open(directory / "host.log", "wb") as log:
        popen = subprocess.Popen(
            ["strace", "-f", "-qq", "-ttt", "-e", "trace=fsync,openat", "-o", str(trace),
             "--", os.sys.executable, "-I", "-S", helpers.MAIN],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, close_fds=True,
            start_new_session=True)
    popen.stdin.write(json.dumps(spec).encode())
    popen.stdin.close()
    ready = json.loads(popen.stdout.readline())
    record = helpers.HostRun(directory, spec, ready, popen).wait_record(timeout=120)
    assert record["totalBytes"] == 3_000_000
    helpers.wait_gone(ready["pid"])
    popen.wait(timeout=helpers.LIVENESS)
    time.sleep(0.2)
    lines = [x.split(None, 1)[1] for x in trace.read_text().splitlines()
             if x.split()[0] == str(ready["pid"])]  # the host's own calls: "TIME call"
    log_fd = next(x.rsplit("=", 1)[1].strip() for x in lines if "output.raw" in x)
    record_at = next(i for i, x in enumerate(lines) if ".exit.json.tmp" in x)
    syncs = [float(x.split()[0]) for x in lines[:record_at] if f"fsync({log_fd})" in x]
    flowing = syncs[:-1]  # the last one is the sync before exit.json
    assert len(flowing) >= 1, lines  # the output flowed for ~3 s
    assert all(b - a >= 0.99 for a, b in zip(flowing, flowing[1:])), flowing


def _pids_cgroup(tmp_path) -> Path | None:
    root = Path("/sys/fs/cgroup/pids")
    if not (root / "cgroup.procs").exists() or not os.access(root, os.W_OK):
        return None
    group = root / f"dsh-test-{tmp_path.name}"
    try:
        group.mkdir()
    except OSError:
        return None
    return group


def test_a_fork_at_the_pids_limit_is_a_spawn_failure_naming_the_limit(tmp_path):
    group = _pids_cgroup(tmp_path)
    if group is None:
        pytest.skip("no writable cgroup v1 pids hierarchy")
    directory = tmp_path / "call"
    directory.mkdir(mode=0o700)
    spec = helpers.make_spec(directory, ["/bin/true"], linger=0.0)
    try:
        (group / "pids.max").write_text("2")  # main.py + the host; the command's fork fails
        with open(directory / "host.log", "wb") as log:
            popen = subprocess.Popen([os.sys.executable, "-I", "-S", helpers.MAIN],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                     close_fds=True, start_new_session=True)
        (group / "cgroup.procs").write_text(str(popen.pid))  # it waits for the spec
        popen.stdin.write(json.dumps(spec).encode())
        popen.stdin.close()
        ready = json.loads(popen.stdout.readline())  # main.py stays a zombie until reaped
        assert ready["ok"] is True and ready["commandPid"] is None, ready
        record = helpers.HostRun(directory, spec, ready, popen).wait_record()
        popen.wait(timeout=helpers.LIVENESS)
        helpers.wait_gone(ready["pid"])
    finally:
        for _ in range(100):  # the host's last exit may still be on its way
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)
    assert record["reason"] == "spawn-failed" and record["errno"] == "EAGAIN", record
    assert "resource limit" in record["message"] and "pids.max" in record["message"]
