"""Terminal mode, stdin, resize and signals through the real host's control socket."""

from __future__ import annotations

import sys

import pytest

TTY = {"cols": 91, "rows": 17, "term": "xterm-256color"}


def test_tty_shows_a_terminal_its_size_and_interactive(hosts):
    run = hosts(["/bin/sh", "-c", "tty; stty size; test -t 0 && echo interactive; echo $TERM"],
                tty=TTY)
    record = run.wait_record()
    lines = run.output().decode().splitlines()
    assert record["exitCode"] == 0, (record, lines)
    assert lines[0].startswith("/dev/pts/"), lines
    assert lines[1:] == ["17 91", "interactive", "xterm-256color"]


def test_resize_then_stty_size_shows_the_new_size(hosts):
    run = hosts(["/bin/sh", "-c", "stty size; read x; stty size"], tty=TTY)
    run.wait_output(b"17 91")
    conn = run.connect()
    assert conn.request("resize", cols=120, rows=40) == {"id": 1, "ok": True}
    assert conn.write(b"go\n")["written"] == 3
    run.wait_record()
    assert run.output().splitlines()[-1] == b"40 120"
    bad = conn.request("resize", cols=0, rows=10)
    assert bad["ok"] is False and bad["code"] == "bad-request"


def test_a_python_input_program_answers_a_written_line(hosts):
    program = "name = input('name? '); print('hello', name[::-1])"
    run = hosts([sys.executable, "-I", "-S", "-c", program], tty=TTY)
    run.wait_output(b"name? ")
    conn = run.connect()
    conn.request("attach")
    assert conn.write(b"olleh\n") == {"id": 2, "ok": True, "written": 6}
    record = conn.next_event("exit")["record"]
    assert record["exitCode"] == 0
    assert b"hello hello" in run.output()


@pytest.mark.parametrize("tty", [None, TTY], ids=["pipe", "tty"])
def test_close_stdin_ends_cat(hosts, tty):
    run = hosts(["/bin/cat"], tty=tty, stdin="pipe")
    conn = run.connect()
    assert conn.write(b"one\n")["written"] == 4
    run.wait_output(b"one")
    assert conn.request("close-stdin") == {"id": 2, "ok": True}
    record = run.wait_record()
    assert record["exitCode"] == 0 and record["reason"] == "exited"
    after = conn.write(b"late")
    assert after["ok"] is False and after["code"] in ("not-running", "no-stdin"), after


def test_a_pipe_call_without_stdin_refuses_writes(hosts):
    run = hosts(["/bin/sh", "-c", "cat; echo eof-at-once"])
    run.wait_record()
    assert b"eof-at-once" in run.output()
    run2 = hosts(["/bin/sleep", "30"])
    conn = run2.connect()
    reply = conn.write(b"x")
    assert reply["ok"] is False and reply["code"] == "no-stdin", reply
    big = conn.write(b"x" * ((1 << 20) + 1))
    assert big["ok"] is False and big["code"] == "too-big", big
    assert conn.request("terminate", grace=0.5)["ok"] is True
    assert run2.wait_record()["reason"] == "cancelled"


def test_a_write_is_answered_once_written(hosts):
    # 3 MiB into a reader that reads slowly: each 1 MiB write is answered only when written,
    # and every byte arrives.
    run = hosts(["/bin/sh", "-c", "sleep 1; exec /bin/cat"], stdin="pipe")
    conn = run.connect()
    chunk = bytes(range(256)) * 4096
    for _ in range(3):
        assert conn.write(chunk)["written"] == len(chunk)
    conn.request("close-stdin")
    record = run.wait_record()
    assert record["totalBytes"] == 3 * len(chunk)
    assert run.output() == chunk * 3


@pytest.mark.parametrize("tty", [None, TTY], ids=["pipe", "tty"])
def test_signal_int_reaches_a_trap(hosts, tty):
    script = "trap 'echo got-INT; exit 3' INT; echo ready; while :; do sleep 0.1; done"
    run = hosts(["/bin/sh", "-c", script], tty=tty)
    run.wait_output(b"ready")
    conn = run.connect()
    reply = conn.request("signal", signal="INT")
    assert reply["ok"] is True and reply["signalled"] >= 1, reply
    record = run.wait_record()
    assert record["exitCode"] == 3 and record["reason"] == "exited", record
    assert b"got-INT" in run.output()
    assert conn.request("signal", signal="INT")["code"] == "not-running"
    assert conn.request("signal", signal="BOGUS")["code"] == "bad-request"


def test_terminate_is_served_behind_a_write_the_command_never_reads(hosts):
    run = hosts(["/bin/sleep", "300"], stdin="pipe")
    conn = run.connect()
    conn._next_id = 2
    conn.send_line({"id": 1, "op": "write", "data": "eHh4" * 300000})  # 900 kB, never read
    assert conn.request("status")["state"] == "running"
    assert conn.request("terminate", grace=0.5)["ok"] is True
    reply = conn.read_line()  # the write's, failed once the command is gone
    assert reply["id"] == 1 and reply["ok"] is False, reply
    assert reply["code"] in ("not-running", "no-stdin"), reply
    assert run.wait_record()["reason"] == "cancelled"


def test_a_command_that_closes_its_terminal_is_not_hung_up_while_it_runs(hosts):
    # closing the PTY master at EIO (every slave fd closed) hung the terminal up: SIGHUP to
    # a session leader still running (cat killed by SIGHUP between its close and its exit)
    run = hosts(["/bin/sh", "-c", "echo bye; exec 0<&- 1>&- 2>&-; sleep 0.5; exit 5"], tty=TTY)
    record = run.wait_record()
    assert record["exitCode"] == 5 and record["signal"] is None, record
    assert run.output() == b"bye\r\n"
