"""``client.link``: a lost connection is opened again within the reconnect budget, one line
when it is lost and one when it is back; a refusal is not a loss; a daemon that drops every
connection cannot keep the client looping past its budget. Against ``FakeDshd`` on a real
Unix socket (the real daemon's restarts are tests/e2e/test_cli_reconnect.py)."""

from __future__ import annotations

import pytest
import trio

from client.api import DaemonGone, DaemonNotRunning
from client.exits import single
from client.link import STABLE_S, open_link, ride
from protocol.rpc import RpcError
from tests.client.fake_dshd import FakeDshd, FakeError

STATUS = {"version": "0", "pid": 1, "startedAt": 0, "sessionsOpen": 0, "connections": 1,
          "subscriptions": 0, "droppedBatches": 0, "stateDir": "/nowhere",
          "sandbox": {"provider": "bwrap", "completeness": "full"}}


async def _serve(nursery: trio.Nursery, tmp_path) -> FakeDshd:
    fake = FakeDshd(str(tmp_path / "fake.sock"))
    await nursery.start(fake.serve)
    return fake


def _initializes(fake: FakeDshd) -> int:
    return sum(1 for method, _ in fake.requests if method == "initialize")


async def test_a_lost_connection_is_opened_again_with_one_line_each_way(tmp_path):
    async with trio.open_nursery() as nursery:
        fake = await _serve(nursery, tmp_path)
        drops = [True]

        async def status(params):
            if drops and drops.pop():
                await fake.close_connections()  # the daemon goes away mid-request
                await trio.sleep_forever()
            return STATUS

        fake.handlers["daemon.status"] = status
        lines: list[str] = []
        with trio.fail_after(10):
            async with open_link(fake.path, timeout=5) as link:
                result = await ride(link, lambda c: c.status(), lines.append)
        nursery.cancel_scope.cancel()
    assert result.pid == 1
    assert lines == ["dsh: lost dshd; reconnecting (up to 5 s)…", "dsh: reconnected to dshd"]
    assert _initializes(fake) == 2 and link.reconnects == 1


async def test_a_refusal_is_not_a_lost_connection(tmp_path):
    async with trio.open_nursery() as nursery:
        fake = await _serve(nursery, tmp_path)

        async def status(params):
            raise FakeError(-32602, "no")

        fake.handlers["daemon.status"] = status
        lines: list[str] = []
        with pytest.raises(BaseException) as raised, trio.fail_after(10):
            async with open_link(fake.path, timeout=5) as link:
                await ride(link, lambda c: c.status(), lines.append)
        nursery.cancel_scope.cancel()
    assert isinstance(single(raised.value), RpcError) and lines == []
    assert _initializes(fake) == 1


async def test_a_daemon_that_drops_every_connection_ends_within_the_budget(tmp_path):
    """Each connection lives a moment (less than STABLE_S): the outages share one budget."""
    async with trio.open_nursery() as nursery:
        fake = await _serve(nursery, tmp_path)

        async def status(params):
            await fake.close_connections()
            await trio.sleep_forever()

        fake.handlers["daemon.status"] = status
        lines: list[str] = []
        started = trio.current_time()
        with pytest.raises(BaseException) as raised, trio.fail_after(STABLE_S + 20):
            async with open_link(fake.path, timeout=1.5) as link:
                await ride(link, lambda c: c.status(), lines.append)
        took = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert isinstance(single(raised.value), DaemonGone), raised.value
    assert _initializes(fake) >= 2, "it never reconnected"
    assert took < STABLE_S, f"the budget restarted on every reconnect ({took:.1f} s)"
    assert all(line.startswith("dsh: lost dshd") or line == "dsh: reconnected to dshd"
               for line in lines), lines


async def test_a_daemon_that_never_comes_back_is_daemon_gone_after_the_timeout(tmp_path):
    fake = FakeDshd(str(tmp_path / "fake.sock"))
    gone_scope = trio.CancelScope()

    async def serve(task_status=trio.TASK_STATUS_IGNORED):
        with gone_scope:
            await fake.serve(task_status=task_status)

    async def status(params):
        gone_scope.cancel()  # the whole daemon ends: the socket refuses from now on
        await trio.sleep_forever()

    fake.handlers["daemon.status"] = status
    lines: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(serve)
        with pytest.raises(BaseException) as raised, trio.fail_after(20):
            async with open_link(fake.path, timeout=1) as link:
                started = trio.current_time()
                await ride(link, lambda c: c.status(), lines.append)
    gone = single(raised.value)
    assert isinstance(gone, DaemonGone) and "within 1 s" in str(gone), gone
    assert trio.current_time() - started >= 0.9
    assert lines == ["dsh: lost dshd; reconnecting (up to 1 s)…"]


async def test_timeout_zero_never_reconnects(tmp_path):
    async with trio.open_nursery() as nursery:
        fake = await _serve(nursery, tmp_path)

        async def status(params):
            await fake.close_connections()
            await trio.sleep_forever()

        fake.handlers["daemon.status"] = status
        lines: list[str] = []
        with pytest.raises(BaseException) as raised, trio.fail_after(10):
            async with open_link(fake.path, timeout=0) as link:
                await ride(link, lambda c: c.status(), lines.append)
        nursery.cancel_scope.cancel()
    assert not isinstance(single(raised.value), DaemonGone) and lines == []
    assert _initializes(fake) == 1


async def test_the_first_connection_is_not_retried(tmp_path):
    with pytest.raises(BaseException) as raised, trio.fail_after(10):
        async with open_link(str(tmp_path / "nobody.sock"), timeout=30):
            pass
    assert isinstance(single(raised.value), DaemonNotRunning)
