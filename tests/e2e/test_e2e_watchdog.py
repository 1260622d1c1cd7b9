"""The systemd watchdog (issue 9 item 3): a real dshd subprocess with a real NOTIFY_SOCKET and
WATCHDOG_USEC pings WATCHDOG=1 every WATCHDOG_USEC/2 while it makes progress, says what it does
in STATUS=, and stops pinging while a session writer's fsync hangs (fault injection:
fault_fsync_hang.py), while its event loop still answers; once the fsync returns, the pings
resume."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import DaemonProcess
from .notify import NotifyListener

HOOK = Path(__file__).with_name("fault_fsync_hang.py")
WATCHDOG_USEC = 2_000_000  # pings every 1 s; a write in flight > 1 s is stuck


class HangableDaemon(DaemonProcess):
    """dshd started through the fault-injection hook: fsync hangs while ``flag`` exists."""

    def __init__(self, root: Path, flag: Path) -> None:
        super().__init__(root)
        self.flag = flag

    def command(self) -> list[str]:
        return [sys.executable, str(HOOK), str(self.flag), *super().command()[3:]]


@pytest.fixture
def short_dir():
    d = Path(tempfile.mkdtemp(prefix="dsh-wd-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _pings(messages) -> int:
    return sum(1 for m in messages if m.get("WATCHDOG") == "1")


def test_watchdog_pings_stop_while_a_session_writer_hangs_in_fsync(short_dir, workdir, monkeypatch):
    notify = NotifyListener(short_dir / "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify.path))
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    flag = short_dir / "hang-fsync"
    d = HangableDaemon(short_dir, flag)
    during = None
    try:
        d.start()
        notify.wait_for(lambda m: m.get("READY") == "1", 30, since=0)
        for _ in range(3):  # periodic pings while all is well
            notify.wait_for(lambda m: m.get("WATCHDOG") == "1", 30)
        status = notify.wait_for(lambda m: "STATUS" in m, 30, since=0)["STATUS"]
        assert "sessions open" in status and "connections" in status
        ok = d.dsh("run", "--", "echo", "before", cwd=str(workdir))
        assert ok.returncode == 0 and ok.stdout == "before\n", ok.stderr

        flag.touch()  # from now on every fsync hangs: the next durable write is stuck
        during = subprocess.Popen(
            [sys.executable, "-m", "client.cli", "run", "--", "echo", "during"], env=d.env,
            cwd=str(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        withheld = notify.wait_for(lambda m: "watchdog withheld" in m.get("STATUS", ""), 30)
        assert "fsync" in withheld["STATUS"] and "session" in withheld["STATUS"]
        quiet = notify.collect(4 * WATCHDOG_USEC / 2 / 1e6)
        assert _pings(quiet) == 0, quiet  # no ping while the writer is stuck ...
        st = d.dsh("status", "--json", timeout=30)  # ... though the event loop answers
        assert st.returncode == 0 and d.running, st.stderr
        assert during.poll() is None  # the call waits at its barrier, not run

        flag.unlink()  # the disk answers again
        notify.wait_for(lambda m: m.get("WATCHDOG") == "1", 30)
        out, err = during.communicate(timeout=60)
        assert during.returncode == 0 and out == "during\n", err
        log = d.log_path.read_text()
        assert '"watchdog.withheld"' in log and '"watchdog.resumed"' in log
    finally:
        if flag.exists():
            flag.unlink()
        if during is not None and during.poll() is None:
            during.kill()
            during.wait(10)
        d.stop()
        notify.close()


def test_no_watchdog_is_not_pinged(short_dir, monkeypatch):
    """WATCHDOG_PID naming another process: that watchdog is not ours (sd_watchdog_enabled)."""
    from dshd.service import watchdog_interval

    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}, pid=7) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, pid=7) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "8"}, pid=7) is None
    assert watchdog_interval({}, pid=7) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}, pid=7) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}, pid=7) is None
