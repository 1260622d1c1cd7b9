"""Tool calls through their call host, over the wire (HOST.md §3, §5; plan §A, §D): the bash
arguments tty/cols/rows/stdin, the call dir, the spill path and droppedBytes. Harness:
``conftest.py``."""

from __future__ import annotations

import json
import os
import stat

import pytest


async def run_args(wire, sid: str, arguments: dict) -> str:
    params = {"sessionId": sid, "name": "bash", "arguments": arguments, "approved": True}
    return (await wire.call("tool.run", params))["callId"]


async def test_a_tty_call_has_a_terminal_of_its_size_and_term(daemon, daemon_clock, nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    call_id = await run_args(wire, sid, {
        "command": "test -t 0 && test -t 1 && echo interactive; stty size; echo TERM=$TERM",
        "tty": True, "cols": 100, "rows": 30})
    result = await wire.wait(sid, call_id)
    assert result["exitCode"] == 0, result
    text = result["content"].replace("\r", "")
    assert "interactive\n" in text and "30 100\n" in text and "TERM=xterm-256color\n" in text


async def test_a_pipe_call_has_empty_stdin_and_no_terminal(daemon, daemon_clock, nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    call_id = await run_args(wire, sid, {"command": "test -t 0 || echo no-tty; cat; echo eof"})
    result = await wire.wait(sid, call_id)
    assert result["content"] == "no-tty\neof\n"


@pytest.mark.parametrize(("arguments", "field"), [
    ({"tty": True, "cols": 0}, "arguments.cols"),
    ({"tty": True, "rows": 10_001}, "arguments.rows"),
    ({"stdin": "file"}, "arguments.stdin"),
    ({"tty": "yes"}, "arguments.tty"),
])
async def test_bad_terminal_arguments_are_refused_with_a_sentence(
        daemon, daemon_clock, nursery, arguments, field):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    err = await wire.error("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                        "arguments": {"command": "true", **arguments}})
    assert err.code == -32602 and field.split(".")[1] in err.message, err.message


async def test_the_call_dir_holds_the_log_and_the_spill_path_names_it(
        daemon, daemon_clock, nursery):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    call_id = await run_args(wire, sid, {"command": "seq 1 100000"})
    result = await wire.wait(sid, call_id)
    call_dir = daemon.state_dir / "sessions" / sid / "calls" / call_id
    assert stat.S_IMODE(call_dir.stat().st_mode) == 0o700
    raw = call_dir / "output.raw"
    assert result["details"]["spillPath"] == str(raw)
    assert raw.read_bytes() == b"".join(b"%d\n" % i for i in range(1, 100_001))
    assert stat.S_IMODE(raw.stat().st_mode) == 0o600
    record = json.loads((call_dir / "exit.json").read_text())
    assert record["reason"] == "exited" and record["exitCode"] == 0
    truncation = result["details"]["truncation"]
    assert truncation["totalLines"] == 100_000 and "droppedBytes" not in truncation
    assert result["content"].endswith("100000\n")


@pytest.mark.parametrize("daemon_overrides", [{"spill_max_bytes": 65_536}])
async def test_the_disk_cap_drops_the_oldest_and_says_how_much(
        daemon, daemon_clock, nursery, daemon_overrides):
    wire = await daemon.connect(nursery=nursery)
    sid = await daemon.create_session(wire)
    call_id = await run_args(wire, sid, {"command": "head -c 1000000 /dev/zero | tr '\\0' x; "
                                                    "echo; echo last"})
    result = await wire.wait(sid, call_id)
    truncation = result["details"]["truncation"]
    call_dir = daemon.state_dir / "sessions" / sid / "calls" / call_id
    on_disk = sum(p.stat().st_size for p in call_dir.glob("output.raw*"))
    assert on_disk <= 65_536
    assert truncation["totalBytes"] == 1_000_006
    assert truncation["droppedBytes"] == 1_000_006 - on_disk > 0
    assert truncation["truncated"] is True
    assert result["content"].endswith("x\nlast\n")
    assert not any(name.startswith("spill") for name in os.listdir(call_dir.parent.parent))
