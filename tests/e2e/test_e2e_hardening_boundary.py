"""What the daemon accepts at its RPC boundary, session call limits, and the shape of results
(issue 10 items 2a, 14, 15, 19, 21, 24). Every test talks to a real ``dshd`` over its socket
(``tests/e2e/wire.py``) or runs the real ``dsh`` CLI, so it keeps guarding through a
restructure of what lies behind the socket."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import DaemonProcess
from .wire import Lane, Wire, events

BIG_INT = 9007199254740993  # 2^53 + 1


def _configured(tmp: Path, toml: str) -> DaemonProcess:
    cfg = tmp / "dshd.toml"
    cfg.write_text(toml)
    d = DaemonProcess(tmp, ["--config", str(cfg)])
    d.start()
    return d


@pytest.fixture
def tiny_daemon():
    """A daemon with small call limits and a scripted model that proposes refused calls."""
    root = Path(tempfile.mkdtemp(prefix="dsh-bnd-"))
    script = root / "script.jsonl"
    script.write_text("\n".join(json.dumps(line) for line in [
        {"text": "calling", "toolCalls": [
            {"name": "nosuch", "arguments": {"command": "true"}},
            {"name": "bash", "arguments": {}},
            {"name": "bash", "arguments": json.dumps({"command": "true", "timeout": BIG_INT})},
            {"name": "bash", "arguments": "{not json"},
            {"name": "bash", "arguments": {"command": "echo from-model"}},
        ]},
        {"text": "done"},
    ]) + "\n")
    d = _configured(root, (
        "max_calls_per_session = 2\nmax_calls = 3\nsandbox_provider = \"none\"\n"
        f"[model]\nprovider = \"scripted\"\nscript = \"{script}\"\n"))
    try:
        yield d
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def wire(daemon):
    w = Wire(daemon.socket)
    try:
        yield w
    finally:
        w.close()


def _session(w: Wire, cwd: Path, **params) -> str:
    return w.result("session.create", {"cwd": str(cwd), **params})["sessionId"]


def _run(w: Wire, sid: str, command: str, **params) -> dict:
    return w.call("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                               "arguments": {"command": command}, **params})


def _tool_events(w: Wire, sid: str) -> list[dict]:
    return [e for e in events(w, sid) if e["type"].startswith("tool/")]


# ---------------------------------------------------------------------- 2(a): JSON values
def test_values_that_are_not_json_values_are_refused_and_nothing_is_recorded(wire, daemon,
                                                                              workdir):
    sid = _session(wire, workdir)
    lane = Lane(wire, sid)
    bad = [
        {"command": "true", "n": BIG_INT},
        {"command": "true", "deep": [{"x": [-(2**60)]}]},
        {"command": "true", "timeout": BIG_INT},
    ]
    for arguments in bad:
        answer = wire.call("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                        "arguments": arguments, "callId": "bad1"})
        assert answer["error"]["code"] == -32602, answer
        assert "arguments" in answer["error"]["message"]
    # A float beyond the double range cannot be parsed at all: -32602 too, nothing recorded.
    raw = (b'{"jsonrpc":"2.0","id":99,"method":"tool.run","params":{"sessionId":"' + sid.encode()
           + b'","name":"bash","approved":true,"callId":"bad2","arguments":'
           b'{"command":"true","f":1e400}}}\n')
    wire.sock.sendall(raw)
    while True:
        answer = wire._read()
        if answer.get("id") == 99:
            break
    assert answer["error"]["code"] == -32602, answer
    # A reserved segment where it would become a lane path (tools.<callId>): -32602 too.
    for reserved in ("__proto__", "constructor", "prototype"):
        assert _run(wire, sid, "true", callId=reserved)["error"]["code"] == -32602
    assert _tool_events(wire, sid) == []
    # The session is not wedged: a good call runs, and the lane never showed the bad ones.
    ok = _run(wire, sid, "echo fine", callId="good")
    assert ok["result"] == {"callId": "good"}
    result = wire.result("tool.wait", {"sessionId": sid, "callId": "good", "timeout": 30})
    assert result["exitCode"] == 0 and result["content"] == "fine\n"
    assert [e["data"]["callId"] for e in _tool_events(wire, sid)] == ["good", "good"]
    while not any(r["callId"] == "good" for r in (lane.value or {}).get("recent", [])):
        view = lane.next()
        assert set(view["tools"]) <= {"good"}
    assert [r["callId"] for r in lane.value["recent"]] == ["good"]
    assert wire.error("tool.wait", {"sessionId": sid, "callId": "bad1"})["code"] == -32006


# ---------------------------------------------------------------------- 14: string caps
def test_free_form_strings_are_capped_at_the_boundary(wire, daemon, workdir):
    cases = [
        ("session.create", {"cwd": str(workdir), "title": "t" * 2_000_000}, "title", "1024"),
        ("session.create", {"cwd": "/" + "a" * 5000}, "cwd", "4096"),
        ("session.create", {"cwd": str(workdir), "env": {f"V{i}": "x" for i in range(300)}},
         "env", "256"),
        ("session.create", {"cwd": str(workdir), "env": {"V" * 300: "x"}}, "env", "256"),
        ("session.create", {"cwd": str(workdir), "env": {"V": "x" * 40_000}}, "env", "32768"),
    ]
    for method, params, field, cap in cases:
        err = wire.error(method, params)
        assert err["code"] == -32602, (field, err)
        assert field in err["message"] and cap in err["message"], err["message"]
    sid = _session(wire, workdir, title="ok")
    cases = [
        ("tool.run", {"sessionId": sid, "name": "bash", "approved": True, "callId": "huge",
                      "arguments": {"command": "true", "pad": "p" * (9 * 1024 * 1024)}},
         "arguments", "8388608"),
        ("turn.start", {"sessionId": sid, "input": "i" * (1024 * 1024 + 1)}, "input", "1048576"),
        ("turn.steer", {"sessionId": sid, "input": "i" * (1024 * 1024 + 1)}, "input", "1048576"),
    ]
    for method, params, field, cap in cases:
        err = wire.error(method, params)
        assert err["code"] == -32602, (field, err)
        assert field in err["message"] and cap in err["message"], err["message"]
    assert _tool_events(wire, sid) == []
    assert not [e for e in events(wire, sid) if e["type"].startswith("turn/")]
    # Titles at the cap work, and session.list keeps answering, before and after a restart.
    for _ in range(3):
        _session(wire, workdir, title="T" * 1024)
    assert len(wire.result("session.list", {})["sessions"]) == 4
    wire.close()
    daemon.restart()
    w2 = Wire(daemon.socket)
    try:
        listed = w2.result("session.list", {})["sessions"]
        assert len(listed) == 4 and {len(s["title"]) for s in listed} == {2, 1024}
    finally:
        w2.close()


def test_the_lane_carries_at_most_4_kib_of_a_calls_arguments(wire, daemon, workdir):
    sid = _session(wire, workdir, sandbox="danger-full-access")
    lane = Lane(wire, sid)
    heredoc = "cat > big.txt <<'EOF'\n" + ("0123456789abcdef" * 64 + "\n") * 1100 + "EOF\n"
    assert len(heredoc) > 1024 * 1024
    assert _run(wire, sid, heredoc, callId="big")["result"] == {"callId": "big"}
    seen = None
    while not any(r["callId"] == "big" for r in (lane.value or {}).get("recent", [])):
        view = lane.next()
        if "big" in view["tools"]:
            seen = json.loads(json.dumps(view["tools"]["big"]))
    assert seen is not None, "the call never showed in the lane"
    assert seen["argsCut"] is True
    assert isinstance(seen["args"], str) and len(seen["args"].encode()) <= 4096
    assert json.dumps({"command": heredoc}, separators=(",", ":"))[:100] == seen["args"][:100]
    # No batch re-sent the megabyte (a bound far below the argument's size).
    assert sum(wire.note_sizes) < 256 * 1024, wire.note_sizes
    # The log keeps the whole arguments.
    call = next(e for e in events(wire, sid) if e["type"] == "tool/call")
    assert json.loads(call["data"]["arguments"]) == {"command": heredoc}
    # A small call's arguments are in the lane as they are, unmarked.
    assert _run(wire, sid, "sleep 0.5", callId="small")["result"] == {"callId": "small"}
    while "small" not in lane.value["tools"]:
        lane.next()
    entry = lane.value["tools"]["small"]
    assert entry["args"] == {"command": "sleep 0.5"} and "argsCut" not in entry


# ---------------------------------------------------------------------- 15: call limits
def test_calls_per_session_and_per_daemon_are_bounded(tiny_daemon, workdir):
    w = Wire(tiny_daemon.socket)
    try:
        a = _session(w, workdir, sandbox="danger-full-access")
        b = _session(w, workdir, sandbox="danger-full-access")
        for cid in ("a1", "a2"):
            assert _run(w, a, "sleep 60", callId=cid)["result"] == {"callId": cid}
        err = _run(w, a, "sleep 60", callId="a3")["error"]
        assert err["code"] == -32013
        assert "max_calls_per_session" in err["message"] and "2" in err["message"], err
        assert _run(w, b, "sleep 60", callId="b1")["result"] == {"callId": "b1"}
        err = _run(w, b, "sleep 60", callId="b2")["error"]
        assert err["code"] == -32013
        assert "max_calls " in err["message"] and "3" in err["message"], err
        # Nothing of the refused calls was recorded.
        called = [e["data"]["callId"] for s in (a, b) for e in _tool_events(w, s)
                  if e["type"] == "tool/call"]
        assert sorted(called) == ["a1", "a2", "b1"]
        assert w.error("tool.wait", {"sessionId": a, "callId": "a3"})["code"] == -32006
        # Once one settles, a new call is accepted again.
        assert w.result("tool.cancel", {"sessionId": a, "callId": "a1"}) == {"cancelled": True}
        w.result("tool.wait", {"sessionId": a, "callId": "a1", "timeout": 30})
        assert _run(w, b, "sleep 60", callId="b2")["result"] == {"callId": "b2"}
        # A model's call past the limit settles LIMIT_EXCEEDED (a result, not a crash).
        model_calls = _turn(w, b)
        limited = [r for r in model_calls.values() if r["errorCode"] == "LIMIT_EXCEEDED"]
        assert len(limited) == 1 and "max_calls" in limited[0]["content"], model_calls
        assert "truncation" in limited[0]["details"]
        for cid in ("a2", "b1", "b2"):
            w.result("tool.cancel", {"sessionId": a if cid == "a2" else b, "callId": cid})
    finally:
        w.close()


def _turn(w: Wire, sid: str) -> dict[str, dict]:
    """Run one scripted turn to its end; the results of the calls the model proposed, by id,
    each asked for with tool.wait at once (a settled call answers immediately)."""
    turn_id = w.result("turn.start", {"sessionId": sid, "input": "go"})["turnId"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        evs = events(w, sid)
        if any(e["type"] == "turn/end" and e["data"]["turnId"] == turn_id for e in evs):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the turn did not end")
    proposed = [c["callId"] for e in evs if e["type"] == "message/assistant"
                and e["data"]["turnId"] == turn_id for c in e["data"].get("toolCalls", [])]
    return {cid: w.result("tool.wait", {"sessionId": sid, "callId": cid, "timeout": 5})
            for cid in proposed}


# ---------------------------------------------------------------------- 19: refused model calls
def test_a_model_call_the_turn_loop_refuses_is_waitable_at_once(tiny_daemon, workdir):
    w = Wire(tiny_daemon.socket)
    try:
        sid = _session(w, workdir, sandbox="danger-full-access", approvalPolicy="never")
        lane = Lane(w, sid)
        results = _turn(w, sid)
        codes = [r["errorCode"] for r in results.values()]
        assert codes == ["UNKNOWN_TOOL", "INVALID_ARGUMENTS", "INVALID_ARGUMENTS",
                         "INVALID_ARGUMENTS", "APPROVAL_REJECTED"], results
        for result in results.values():
            assert result["isError"] is True and result["content"]
            assert result["details"]["truncation"]["totalBytes"] == 0
        while [r["callId"] for r in (lane.value or {"recent": []})["recent"]][:5] != \
                list(results)[::-1]:
            lane.next()
        # ... and they stay waitable after a restart (the log is the truth).
        w.close()
        tiny_daemon.restart()
        w = Wire(tiny_daemon.socket)
        for cid, result in results.items():
            assert w.result("tool.wait", {"sessionId": sid, "callId": cid, "timeout": 5}) == result
    finally:
        w.close()


# ---------------------------------------------------------------------- 21: lane states, results
def test_a_pre_approved_call_enters_the_lane_running_and_keeps_its_started_at(wire, workdir):
    sid = _session(wire, workdir, sandbox="danger-full-access")
    lane = Lane(wire, sid)
    before = int(time.time() * 1000)
    assert _run(wire, sid, "sleep 1; echo done", callId="pre")["result"] == {"callId": "pre"}
    states, started = [], set()
    while not any(r["callId"] == "pre" for r in (lane.value or {}).get("recent", [])):
        view = lane.next()
        entry = view["tools"].get("pre")
        if entry is not None:
            if not states or states[-1] != entry["state"]:
                states.append(entry["state"])
            started.add(entry["startedAt"])
    assert states == ["running"], states
    assert len(started) == 1 and before - 1000 <= started.pop() <= int(time.time() * 1000)


def test_every_result_has_truncation_even_when_the_call_never_ran(tiny_daemon, workdir):
    w = Wire(tiny_daemon.socket)
    try:
        never = _session(w, workdir, approvalPolicy="never", sandbox="danger-full-access")
        ask = _session(w, workdir, approvalPolicy="ask", sandbox="danger-full-access")
        confined = _session(w, workdir, sandbox="workspace-write")  # provider "none"
        cases = {
            "APPROVAL_REJECTED": (never, False),
            "APPROVAL_UNAVAILABLE": (ask, False),
            "SANDBOX_UNAVAILABLE": (confined, True),
        }
        for code, (sid, approved) in cases.items():
            cid = code.lower().replace("_", "-")
            assert _run(w, sid, "echo hi", callId=cid, approved=approved)["result"]
            result = w.result("tool.wait", {"sessionId": sid, "callId": cid, "timeout": 30})
            assert result["errorCode"] == code, result
            trunc = result["details"]["truncation"]
            assert trunc["totalBytes"] == 0 and trunc["totalLines"] == 0
            assert trunc["truncated"] is False and trunc["maxBytes"] > 0
            assert result["content"], result  # the sentence a person reads
    finally:
        w.close()


# ---------------------------------------------------------------------- 24: terminal escapes
EVIL = "\x1b[2K\x1b]0;owned\x07\x9b1m"


def test_the_cli_never_prints_an_untrusted_string_raw(daemon, wire, workdir):
    sid = _session(wire, workdir, title=f"title{EVIL}", sandbox="danger-full-access")
    assert _run(wire, sid, f"echo out; sleep 3 # {EVIL}", callId="esc")["result"]
    lane = Lane(wire, sid)
    while "esc" not in (lane.value or {}).get("tools", {}):
        lane.next()
    attach = daemon.dsh("attach", sid)
    assert attach.returncode == 0, attach.stderr
    assert attach.stdout == "out\n"  # the tool's own output, as is
    header = [line for line in attach.stderr.splitlines() if "call esc" in line]
    assert header and "\\x1b[2K" in header[0], attach.stderr
    listed = daemon.dsh("sessions")
    waited = daemon.dsh("wait", sid, f"nosuch{EVIL}")
    assert waited.returncode == 1 and "nosuch\\x1b[2K" in waited.stderr, waited.stderr
    logged = daemon.dsh("log", sid)
    for done in (attach, listed, waited, logged):
        for stream in (done.stdout, done.stderr):
            assert "\x1b" not in stream and "\x07" not in stream and "\x9b" not in stream, stream
    assert f"title\\x1b[2K" in listed.stdout
