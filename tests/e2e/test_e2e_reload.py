"""SIGHUP reloads the config file (issue 9 item 3): a real dshd subprocess with a config file
and a real NOTIFY_SOCKET. Reloadable keys change what the daemon does (a session default, a
limit a request hits, the log level); a fixed key is refused by name and keeps its value;
RELOADING=1 with MONOTONIC_USEC, then READY=1 (sd_notify(3)). A file that does not load
changes nothing."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import DaemonProcess
from .notify import NotifyListener


@pytest.fixture
def short_dir():
    d = Path(tempfile.mkdtemp(prefix="dsh-hup-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _send_raw_line(path: Path, size: int) -> dict:
    """One request line of ``size`` bytes on a new connection; the daemon's first answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(path))
        line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "daemon.status",
                           "params": {"pad": "x" * size}}).encode()
        s.sendall(line + b"\n")
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, "connection closed without an answer"
            buf += chunk
    return json.loads(buf.split(b"\n", 1)[0])


def _sessions(d: DaemonProcess) -> dict[str, dict]:
    r = d.dsh("sessions", "--json")
    assert r.returncode == 0, r.stderr
    return {s["sessionId"]: s for s in json.loads(r.stdout)}


def _reload(d: DaemonProcess, notify: NotifyListener) -> None:
    mark = len(notify.messages)
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    d.proc.send_signal(signal.SIGHUP)
    reloading = notify.wait_for(lambda m: m.get("RELOADING") == "1", 30, since=mark)
    assert before <= int(reloading["MONOTONIC_USEC"]) <= time.clock_gettime_ns(
        time.CLOCK_MONOTONIC) // 1000
    notify.wait_for(lambda m: m.get("READY") == "1", 30, since=mark)


def test_sighup_applies_reloadable_keys_and_refuses_fixed_ones(short_dir, workdir, monkeypatch):
    notify = NotifyListener(short_dir / "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify.path))
    cfg = short_dir / "dshd.toml"
    cfg.write_text('approval_policy = "ask"\nlog_level = "info"\n')
    d = DaemonProcess(short_dir, ["--config", str(cfg)])
    try:
        d.start()
        notify.wait_for(lambda m: m.get("READY") == "1", 30, since=0)
        provider = json.loads(d.dsh("status", "--json").stdout)["sandbox"]["provider"]
        assert provider != "none"
        first = d.dsh("run", "--", "true", cwd=str(workdir))
        assert first.returncode == 0, first.stderr
        (before_id,) = _sessions(d)
        assert _sessions(d)[before_id]["approvalPolicy"] == "ask"
        answer = _send_raw_line(d.socket, 4000)
        assert "max_message_bytes" not in json.dumps(answer)  # 4 KB fits the default limit
        assert '"session.created"' in d.log_path.read_text()

        cfg.write_text('approval_policy = "never"\nmax_message_bytes = 2048\n'
                       'log_level = "warning"\nsandbox_provider = "none"\n')
        log_mark = len(d.log_path.read_text())
        _reload(d, notify)
        assert d.running

        # Reloadable: the session default (a new session gets it; the old one keeps its own) ...
        second = d.dsh("run", "--", "true", cwd=str(workdir))
        assert second.returncode == 0, second.stderr
        sessions = _sessions(d)
        (after_id,) = set(sessions) - {before_id}
        assert sessions[after_id]["approvalPolicy"] == "never"
        assert sessions[before_id]["approvalPolicy"] == "ask"
        # ... a limit the next request hits (a new connection) ...
        answer = _send_raw_line(d.socket, 4000)
        assert answer["error"]["code"] == -32600
        assert "max_message_bytes (2048 bytes)" in answer["error"]["message"]
        # ... and the log level: info lines such as session.created stop.
        log = d.log_path.read_text()[log_mark:]
        assert '"session.created"' not in log
        # Fixed: refused by name, old value kept (the probed sandbox still confines).
        refused = [json.loads(line) for line in log.splitlines()
                   if '"config.reload_refused"' in line]
        assert [r["key"] for r in refused] == ["sandbox_provider"]
        assert refused[0]["kept"] == "auto" and refused[0]["wanted"] == "none"
        assert json.loads(d.dsh("status", "--json").stdout)["sandbox"]["provider"] == provider

        # A file that does not load changes nothing; READY=1 still follows.
        cfg.write_text('approval_policy = "sometimes"\n')
        _reload(d, notify)
        log = d.log_path.read_text()
        assert '"config.reload_failed"' in log and "approval_policy" in log
        third = d.dsh("run", "--", "true", cwd=str(workdir))
        assert third.returncode == 0, third.stderr
        (third_id,) = set(_sessions(d)) - {before_id, after_id}
        assert _sessions(d)[third_id]["approvalPolicy"] == "never"
        assert d.running
    finally:
        d.close()
        notify.close()
