"""The raw channel's reads and input against a real daemon and real call hosts (HOST.md §6,
issue 12): ``tool.read`` is byte-exact over the whole range, for running and settled calls,
also after the daemon restarted; ``tool.write``/``tool.closeStdin`` reach a ``stdin: "pipe"``
call, ``tool.resize`` a tty call's ``stty size``, ``tool.signal INT`` a ``trap``; every bad
input of plan §E and the issue's list is refused with its code, and the session and the other
clients go on working."""

from __future__ import annotations

import base64
import json
import os

import pytest

from .conftest import running_daemon
from .raw_client import (
    RawWire, read_all, run, seq_bytes, session, wait, wait_end_offset, wait_output,
)

#: Random bytes with every hostile feature on purpose: NULs, CRs, lone continuation bytes.
SPECIAL = b"\0\r\n\r\x80\xff\xfe\xc3(\xed\xa0\x80\0\0\r"


def _random_file(path, size: int) -> bytes:
    data = (SPECIAL + os.urandom(max(0, size - len(SPECIAL))))[:size]
    path.write_bytes(data)
    return data


@pytest.fixture
def wire(daemon):
    w = RawWire(daemon.socket)
    try:
        yield w
    finally:
        w.close()


@pytest.mark.parametrize("size", [0, 1, 4096, 51199, 51201, 1 << 20, 9 * (1 << 20) + 7])
def test_tool_read_over_the_whole_range_equals_the_bytes(daemon, wire, workdir, size):
    expected = _random_file(workdir / "blob", size)
    sid = session(wire, workdir)
    call_id = run(wire, sid, "cat blob")
    assert wait(wire, sid, call_id)["exitCode"] == 0
    data, last = read_all(wire, sid, call_id)
    assert data == expected
    assert last["eof"] is True and last["endOffset"] == size and last["firstOffset"] == 0
    # From the middle, with a small limit: the same bytes at the same offsets.
    if size > 10:
        page = wire.result("tool.read", {"sessionId": sid, "callId": call_id,
                                         "offset": size // 2, "limit": 7})
        assert base64.b64decode(page["data"]) == expected[size // 2: size // 2 + 7]
        assert page["eof"] is (size // 2 + 7 >= size)


def test_tool_read_of_a_running_call_and_after_a_restart(daemon, workdir):
    expected = _random_file(workdir / "blob", 300_000)
    w = RawWire(daemon.socket)
    sid = session(w, workdir)
    call_id = run(w, sid, "cat blob; echo; echo half-done; while [ ! -e go ]; do sleep 0.05; done; cat blob")
    wait_output(w, sid, call_id, b"half-done")
    data, last = read_all(w, sid, call_id)
    assert data == expected + b"\nhalf-done\n"
    assert last["eof"] is False  # still running
    (workdir / "go").touch()
    assert wait(w, sid, call_id)["exitCode"] == 0
    whole = expected + b"\nhalf-done\n" + expected
    assert read_all(w, sid, call_id)[0] == whole
    w.close()
    daemon.restart()  # the call left memory: read from its call dir on disk
    w = RawWire(daemon.socket)
    data, last = read_all(w, sid, call_id)
    assert data == whole and last["eof"] is True
    w.close()


def test_signal_int_reaches_a_trap(daemon, wire, workdir):
    sid = session(wire, workdir)
    call_id = run(wire, sid, "trap 'echo got-int; exit 7' INT; echo ready; "
                             "while :; do sleep 0.1; done")
    wait_output(wire, sid, call_id, b"ready")
    assert wire.result("tool.signal", {"sessionId": sid, "callId": call_id,
                                       "signal": "INT"}) == {}
    result = wait(wire, sid, call_id)
    assert result["exitCode"] == 7, result
    assert read_all(wire, sid, call_id)[0] == b"ready\ngot-int\n"


def test_write_and_close_stdin_reach_a_pipe_call(daemon, wire, workdir):
    sid = session(wire, workdir)
    call_id = run(wire, sid, "cat", stdin="pipe")
    payload = b"hello\0\r\n" + bytes(range(256)) * 100
    answer = wire.result("tool.write", {"sessionId": sid, "callId": call_id,
                                        "data": base64.b64encode(payload).decode()})
    assert answer == {"written": len(payload)}
    assert wire.result("tool.closeStdin", {"sessionId": sid, "callId": call_id}) == {}
    assert wait(wire, sid, call_id)["exitCode"] == 0
    assert read_all(wire, sid, call_id)[0] == payload


def test_a_write_after_close_stdin_says_so_once(daemon, wire, workdir):
    """Finding: NO_STDIN after ``tool.closeStdin`` read "the call's stdin is closed (the
    call's stdin is closed)"; it says it once now."""
    sid = session(wire, workdir)
    call_id = run(wire, sid, "sleep 30", stdin="pipe")
    assert wire.result("tool.closeStdin", {"sessionId": sid, "callId": call_id}) == {}
    err = wire.call("tool.write", {"sessionId": sid, "callId": call_id,
                                   "data": base64.b64encode(b"x").decode()})["error"]
    assert err["data"]["code"] == "NO_STDIN", err
    assert err["message"].count("stdin is closed") == 1, err
    wire.result("tool.cancel", {"sessionId": sid, "callId": call_id})


def test_resize_of_a_tty_call_shows_in_stty_size(daemon, wire, workdir):
    sid = session(wire, workdir)
    call_id = run(wire, sid, "stty size; echo go; read x; stty size", tty=True, cols=80, rows=24)
    wait_output(wire, sid, call_id, b"go")
    assert wire.result("tool.resize", {"sessionId": sid, "callId": call_id,
                                       "cols": 100, "rows": 30}) == {}
    wire.result("tool.write", {"sessionId": sid, "callId": call_id,
                               "data": base64.b64encode(b"\n").decode()})
    assert wait(wire, sid, call_id)["exitCode"] == 0
    out = read_all(wire, sid, call_id)[0]
    assert out.startswith(b"24 80\r\n"), out
    assert b"30 100\r\n" in out, out


# ---------------------------------------------------------------------- bad input
def _error(w: RawWire, method: str, params: dict) -> dict:
    return w.error(method, params)


def _still_works(w: RawWire, other: RawWire, sid: str, workdir) -> None:
    """The session and another client keep working after a refusal."""
    assert w.result("session.get", {"sessionId": sid})["sessionId"] == sid
    call_id = run(other, sid, "echo fine")
    assert wait(other, sid, call_id)["content"] == "fine\n"


def test_every_bad_input_is_refused_and_nothing_breaks(daemon, wire, workdir):
    other = RawWire(daemon.socket)
    sid = session(wire, workdir)
    settled = run(wire, sid, "seq 1 1000")
    wait(wire, sid, settled)
    end = len(seq_bytes(1, 1000))
    plain = run(wire, sid, "echo up; sleep 60")  # no stdin, no tty
    wait_output(wire, sid, plain, b"up")
    tty = run(wire, sid, "echo up; sleep 60", tty=True)
    wait_output(wire, sid, tty, b"up")
    ids = {"sessionId": sid}
    data = base64.b64encode(b"x").decode()
    cases = [
        # (method, params, code, check of the error)
        ("tool.write", {**ids, "callId": settled, "data": data}, -32006,
         lambda e: e["data"]["code"] == "CALL_SETTLED"),
        ("tool.closeStdin", {**ids, "callId": settled}, -32006, None),
        ("tool.resize", {**ids, "callId": settled, "cols": 80, "rows": 24}, -32006, None),
        ("tool.signal", {**ids, "callId": settled, "signal": "INT"}, -32006, None),
        ("tool.write", {**ids, "callId": plain, "data": data}, -32602,
         lambda e: 'stdin: "pipe"' in e["message"] and "tty: true" in e["message"]),
        ("tool.closeStdin", {**ids, "callId": plain}, -32602,
         lambda e: e["data"]["code"] == "NO_STDIN"),
        ("tool.write", {**ids, "callId": tty,
                        "data": base64.b64encode(b"x" * (1024 * 1024 + 1)).decode()}, -32602,
         lambda e: e["data"]["field"] == "data"),
        ("tool.write", {**ids, "callId": tty, "data": "not base64!"}, -32602, None),
        ("tool.resize", {**ids, "callId": tty, "cols": 0, "rows": 0}, -32602,
         lambda e: e["data"]["field"] == "cols"),
        ("tool.resize", {**ids, "callId": tty, "cols": 100000, "rows": 100000}, -32602, None),
        ("tool.resize", {**ids, "callId": plain, "cols": 80, "rows": 24}, -32602,
         lambda e: e["data"]["code"] == "NO_TTY"),
        ("tool.signal", {**ids, "callId": tty, "signal": "SIGINT"}, -32602, None),
        ("tool.signal", {**ids, "callId": tty, "signal": "BOGUS"}, -32602, None),
        ("tool.read", {**ids, "callId": settled, "offset": -1}, -32602, None),
        ("tool.read", {**ids, "callId": settled, "offset": 0, "limit": 4 * 1024 * 1024 + 1},
         -32602, lambda e: e["data"]["field"] == "limit"),
        ("tool.read", {**ids, "callId": settled, "offset": end + 1}, -32602,
         lambda e: e["data"]["endOffset"] == end),
        ("tool.follow", {**ids, "callId": settled, "offset": end + 1}, -32602,
         lambda e: e["data"]["endOffset"] == end),
        ("tool.read", {**ids, "callId": "no-such-call", "offset": 0}, -32006, None),
        ("tool.follow", {**ids, "callId": "no-such-call", "offset": 0}, -32006, None),
        ("tool.write", {**ids, "callId": "no-such-call", "data": data}, -32006, None),
        ("tool.unfollow", {"followId": "follow-999"}, -32602,
         lambda e: e["data"]["field"] == "followId"),
    ]
    for method, params, code, check in cases:
        error = _error(wire, method, params)
        assert error["code"] == code, (method, params.get("callId"), error)
        assert check is None or check(error), (method, error)
    _still_works(wire, other, sid, workdir)
    # The running calls were not disturbed: each still answers and ends when cancelled.
    for call_id in (plain, tty):
        assert wire.result("tool.cancel", {**ids, "callId": call_id})["cancelled"] is True
        assert wait(wire, sid, call_id)["errorCode"] == "TOOL_CANCELLED"
    other.close()


def test_read_before_first_offset_names_it(workdir):
    """A small per-call cap: the oldest bytes are dropped; reading them names firstOffset,
    and the retained bytes are the tail of the output."""
    with running_daemon("spill_max_bytes = 65536\n", prefix="dsh-raw-cap-") as d:
        w = RawWire(d.socket)
        sid = session(w, workdir)
        call_id = run(w, sid, "seq 1 100000")
        result = wait(w, sid, call_id)
        expected = seq_bytes(1, 100000)
        error = w.error("tool.read", {"sessionId": sid, "callId": call_id, "offset": 0})
        assert error["code"] == -32602 and error["data"]["field"] == "offset", error
        first = error["data"]["firstOffset"]
        assert 0 < first < len(expected) and len(expected) - first <= 65536
        error = w.error("tool.read", {"sessionId": sid, "callId": call_id, "offset": first - 1})
        assert error["code"] == -32602 and error["data"]["firstOffset"] == first, error
        page = w.result("tool.read", {"sessionId": sid, "callId": call_id, "offset": first,
                                      "limit": 0})
        assert page["firstOffset"] == first and page["endOffset"] == len(expected)
        data, last = read_all(w, sid, call_id, first)
        assert data == expected[first:] and last["eof"] is True
        assert result["details"]["truncation"].get("droppedBytes") == first
        _still_works(w, RawWire(d.socket), sid, workdir)
        w.close()


def test_read_of_a_running_call_without_output_is_an_empty_page(daemon, wire, workdir):
    """``tool.read`` at 0 of a running call that wrote nothing yet: no data, not eof."""
    sid = session(wire, workdir)
    call_id = run(wire, sid, "sleep 60")
    page = wait_end_offset(wire, sid, call_id, 0)
    assert page["data"] == "" and page["eof"] is False and page["endOffset"] == 0
    wire.result("tool.cancel", {"sessionId": sid, "callId": call_id})
    wait(wire, sid, call_id)


def test_input_to_a_call_that_settles_without_running_is_call_settled(daemon, wire, workdir):
    """A call refused at its approval gate (policy ``ask``, no answerer connected) never runs:
    a write sent before or after it settled is ``-32006`` ``CALL_SETTLED``, never a hang."""
    sid = session(wire, workdir, approvalPolicy="ask")
    call_id = wire.result("tool.run", {"sessionId": sid, "name": "bash",
                                       "arguments": {"command": "cat"}})["callId"]
    error = wire.error("tool.write", {"sessionId": sid, "callId": call_id,
                                      "data": base64.b64encode(b"x").decode()})
    assert error["code"] == -32006 and error["data"]["code"] == "CALL_SETTLED", error
    assert wait(wire, sid, call_id)["isError"] is True
    page = wire.result("tool.read", {"sessionId": sid, "callId": call_id, "offset": 0})
    assert page == {"offset": 0, "data": "", "firstOffset": 0, "endOffset": 0, "eof": True}


def test_writes_a_command_never_reads_do_not_block_signal_or_cancel(daemon, wire, workdir):
    """Eight 1 MiB writes pipelined into a command that never reads its stdin: the host holds
    them, yet tool.signal and tool.cancel from another connection are served (the daemon
    sends one stdin request at a time, so its control connection never stalls), and the
    pending writes are answered once the command is gone. Before: the signal got no answer,
    the cancel did nothing, and a daemon stop left the command running."""
    sid = session(wire, workdir)
    call_id = run(wire, sid, "echo ready; exec sleep 100", stdin="pipe")
    wait_output(wire, sid, call_id, b"ready")
    chunk = base64.b64encode(b"x" * (1 << 20)).decode()
    for i in range(8):  # pipelined: no answer awaited
        wire.next_id += 1
        wire.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": 1000 + i, "method": "tool.write",
                                      "params": {"sessionId": sid, "callId": call_id,
                                                 "data": chunk}}).encode() + b"\n")
    other = RawWire(daemon.socket, timeout=30)  # the liveness bound of every answer below
    try:
        assert other.result("tool.signal", {"sessionId": sid, "callId": call_id,
                                            "signal": "TERM"}) == {}
        result = wait(other, sid, call_id, timeout=30)
        assert result["exitCode"] == 143, result
    finally:
        other.close()
    answered = set()
    while len(answered) < 8:  # every pending write gets an answer (written or settled)
        msg = wire._read()
        if isinstance(msg, dict) and 1000 <= int(msg.get("id") or 0) < 1008:
            answered.add(msg["id"])


def test_a_write_after_the_command_closed_its_stdin_says_so(daemon, wire, workdir):
    """A pipe call whose command closed its stdin: a write is NO_STDIN with a sentence saying
    the stdin is closed (before: "the call was started without stdin", which it was not).
    Without a sandbox: under bwrap the wrapper's own processes hold the pipe's read end as
    well, so a write there waits (back-pressure) until the call ends."""
    sid = session(wire, workdir, sandbox="danger-full-access")
    call_id = run(wire, sid, "exec 0<&-; echo ready; sleep 30", stdin="pipe")
    wait_output(wire, sid, call_id, b"ready")
    data = base64.b64encode(b"x" * 70000).decode()  # more than a pipe holds: EPIPE, not buffered
    err = None
    for _ in range(3):
        answer = wire.call("tool.write", {"sessionId": sid, "callId": call_id, "data": data})
        if "error" in answer:
            err = answer["error"]
            break
    assert err is not None and err["data"]["code"] == "NO_STDIN", err
    assert "stdin is closed" in err["message"] and "started without" not in err["message"], err
    wire.result("tool.cancel", {"sessionId": sid, "callId": call_id})
