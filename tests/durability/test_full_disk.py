"""A full disk under the state directory (a small tmpfs): the barrier fails closed with
STORAGE_FAILURE, nothing earlier is lost, and once space is freed calls work again
(STORAGE.md §4). Needs root (mount); skipped with the reason otherwise."""

from __future__ import annotations

import errno
import os
import secrets
import signal
import subprocess
import time

import pytest

from client.api import connect
from dshd.testing import DshdProcess
from dshd.storage import read_log
from protocol.rpc import STORAGE_FAILURE, RpcError

from .helpers import all_events, as_dicts, assert_paired


@pytest.fixture
def tmpfs_state(root):
    """A 2 MiB tmpfs mounted at ``<root>/state``; always unmounted at teardown."""
    mnt = root / "state"
    mnt.mkdir()
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mnt)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount(8) here: cannot make a small tmpfs for the full-disk test")
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({proc.stderr.strip()}); "
                    "the full-disk test needs root or CAP_SYS_ADMIN")
    try:
        yield mnt
    finally:
        for args in (["umount", str(mnt)], ["umount", "-l", str(mnt)]):
            for _ in range(50):
                if subprocess.run(args, capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            else:
                continue
            break


def fill(path) -> int:
    """Write ``path`` until the file system says ENOSPC, down to single bytes; return bytes."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 8, 1):
            chunk = b"\0" * size
            while True:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return written


async def test_full_disk_fails_closed_and_recovers(root, tmpfs_state, workdir, token):
    daemon = DshdProcess(root, state_dir=tmpfs_state)
    daemon.start()
    marker = workdir / "ran"
    # Incompressible bulk in the command: its tool/call frame cannot fit in a page's slack.
    bulk = secrets.token_urlsafe(12_000)
    try:
        async with connect(daemon.socket) as c:
            sid = await c.create_session(str(workdir), title="full disk")
            one = await c.run_tool(sid, f"echo one # {token}", approved=True)
            assert (await c.wait(sid, one))["content"] == "one\n"
            before = await all_events(c, sid)

            assert fill(tmpfs_state / "filler") > 0
            two = await c.run_tool(sid, f"echo ran > {marker}; echo two # {token} {bulk}",
                                   approved=True)
            try:
                result = await c.wait(sid, two, timeout=30)
            except RpcError as exc:
                assert exc.code == STORAGE_FAILURE
            else:
                assert result["isError"] is True and result["errorCode"] == "STORAGE_FAILURE"
                assert "No space left on device" in result["content"]  # the OS's reason
            assert not marker.exists()
            with pytest.raises(RpcError) as err:
                # (titles are capped at 1,024 chars: the bulk rides in the env, ≤ 32 KiB)
                await c.create_session(str(workdir), title="no room", env={"BULK": bulk})
            assert err.value.code == STORAGE_FAILURE
            # Earlier events are still served, and the daemon still answers.
            assert (await all_events(c, sid))[: len(before)] == before
            assert (await c.status())["pid"] == daemon.pid

            os.unlink(tmpfs_state / "filler")
            three = await c.run_tool(sid, f"echo three # {token}", approved=True)
            assert (await c.wait(sid, three))["content"] == "three\n"
            assert (await c.wait(sid, two))["errorCode"] == "STORAGE_FAILURE"
            assert not marker.exists()
            events = await all_events(c, sid)
            assert events[: len(before)] == before
            assert_paired(events, daemon.state_dir / "sessions" / sid)
        daemon.kill9()  # what tool.wait acknowledged is on disk without a graceful flush
        read = read_log(tmpfs_state / "sessions" / sid, sid)
        assert as_dicts(read.events)[: len(events)] == events

        daemon.start()
        async with connect(daemon.socket) as c:
            after = await all_events(c, sid)
            assert after[: len(events)] == events
            assert_paired(after, daemon.state_dir / "sessions" / sid)
            four = await c.run_tool(sid, f"echo four # {token}", approved=True)
            assert (await c.wait(sid, four))["exitCode"] == 0
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        daemon.close(signal.SIGKILL)
