"""The per-request ``rpc`` log line (dshd/handlers/dispatch.py): at the default info level an
error is logged, a cheap answered request is not (it is a debug line); with
``log_requests_slower_than_ms = 0`` every request is an info line, as before. A real daemon,
its real JSON log."""

from __future__ import annotations

import json
import socket

import pytest

from dshd.testing import DshdProcess


def _rpc_lines(daemon: DshdProcess) -> list[dict]:
    out = []
    for line in daemon.log_path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "rpc":
            out.append(record)
    return out


def _talk(path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(path))
        f = s.makefile("rb")
        calls = [("initialize", {"protocolVersion": 1})] + [("daemon.status", {})] * 3
        calls.append(("no.such.method", {}))
        for i, (method, params) in enumerate(calls, 1):
            s.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method,
                                  "params": params}).encode() + b"\n")
            answer = json.loads(f.readline())
            assert answer["id"] == i, answer


@pytest.mark.parametrize("slower_than", [None, 0])
def test_the_default_level_logs_errors_not_every_cheap_request(tmp_path, slower_than):
    extra = ["--log-level", "info"]
    if slower_than is not None:
        cfg = tmp_path / "dshd.toml"
        cfg.write_text(f"log_requests_slower_than_ms = {slower_than}\n")
        extra += ["--config", str(cfg)]
    daemon = DshdProcess(tmp_path, extra_args=extra)
    daemon.start()
    try:
        _talk(daemon.socket)
    finally:
        daemon.close()
    lines = _rpc_lines(daemon)
    errors = [r for r in lines if r["error"] is not None]
    assert [(r["method"], r["error"], r["level"]) for r in errors] == [
        ("no.such.method", -32601, "info")]
    assert all({"conn", "id", "ms"} <= set(r) for r in lines)
    statuses = [r for r in lines if r["method"] == "daemon.status"]
    if slower_than == 0:
        assert [r["id"] for r in statuses] == [2, 3, 4]
        assert {r["level"] for r in statuses} == {"info"}
    else:
        assert statuses == []  # answered at once: a debug line, not written at info
