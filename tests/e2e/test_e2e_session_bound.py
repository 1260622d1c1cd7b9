"""``max_sessions`` holds against pipelined creates, and running out of file descriptors does not
break ``session.list`` (PROTOCOL.md §3.1). Real dshd processes, the real client.

Theory of operation: a daemon with ``max_sessions = 8`` gets 20 ``session.create`` requests in
flight at once on one connection (the attack: pipelined creates all passed the bound's check
before any of them was counted open, so the bound did not hold and each open session kept
its fds). ``daemon.status``'s ``sessionsOpen`` must stay <= 8 throughout, every created
session must still be usable (a closed one reopens when named) and ``session.list`` answers
all along. With every open session busy (subscribed) the next create is refused, ``-32013``
naming the bound (the documented refusal; a guard, it held before the fix too). A second daemon starts with a low ``RLIMIT_NOFILE`` (``preexec_fn``) and a large
``max_sessions``: creates run until it is out of fds; ``session.list`` still answers (a
session it cannot read is listed with ``unreadable``), and the refused create says dshd has
too many files open, naming the limit, not "permissions and free space". Then the test takes
the fds left (connections dshd accepts until EMFILE, counted in ``/proc/PID/fd``), so even the
sessions directory cannot be read: the list still answers, with every session.
"""

from __future__ import annotations

import os
import socket

import pytest
import trio

from client.api import connect
from protocol.rpc import RpcError

from .conftest import daemon_with_nofile, running_daemon

BOUND = 8
CREATES = 20
#: The low-fd daemon's RLIMIT_NOFILE.
NOFILE = 96


async def test_pipelined_creates_keep_max_sessions_and_all_stay_usable(workdir):
    with running_daemon(f"max_sessions = {BOUND}\n") as d:
        async with connect(d.socket) as c:
            sids: list[str] = []
            peaks: list[int] = []

            async def create(i: int) -> None:
                sids.append(await c.create_session(str(workdir), title=f"s{i}"))
                peaks.append((await c.call("daemon.status"))["sessionsOpen"])

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    for i in range(CREATES):
                        nursery.start_soon(create, i)
            assert len(sids) == CREATES
            assert max(peaks) <= BOUND, peaks
            listed = {i["sessionId"] for i in (await c.call("session.list"))["sessions"]}
            assert set(sids) <= listed
            # Every one is usable: the closed ones reopen when named, the bound still holds.
            with trio.fail_after(300):
                for sid in sids:
                    cid = await c.run_tool(sid, f"echo {sid}", approved=True)
                    assert (await c.wait(sid, cid))["content"] == f"{sid}\n"
                    assert (await c.call("daemon.status"))["sessionsOpen"] <= BOUND
                    assert len((await c.call("session.list"))["sessions"]) == CREATES


async def test_create_past_max_sessions_all_busy_is_refused_naming_the_bound(workdir):
    """Subscribed sessions are busy (never closed to make room): the next create is -32013."""
    with running_daemon("max_sessions = 2\n") as d:
        async with connect(d.socket) as c:
            sids = [await c.create_session(str(workdir)) for _ in range(2)]
            for sid in sids:
                await c.subscribe(sid)
            with pytest.raises(RpcError) as refused:
                await c.create_session(str(workdir))
            assert refused.value.code == -32013, refused.value
            assert "max_sessions = 2" in refused.value.message, refused.value
            assert (await c.call("daemon.status"))["sessionsOpen"] == 2
            listed = {i["sessionId"] for i in (await c.call("session.list"))["sessions"]}
            assert listed == set(sids)


@pytest.fixture
def low_fd_daemon():
    """dshd with RLIMIT_NOFILE 96 and ``max_sessions`` far above what that allows."""
    with daemon_with_nofile(NOFILE, "max_sessions = 1000\n") as d:
        yield d


async def test_session_list_answers_when_dshd_is_out_of_fds(low_fd_daemon, workdir):
    d = low_fd_daemon
    async with connect(d.socket) as c:
        sids: list[str] = []
        refused: RpcError | None = None
        with trio.fail_after(300):
            for _ in range(200):
                try:
                    sids.append(await c.create_session(str(workdir)))
                except RpcError as exc:
                    refused = exc
                    break
                listed = (await c.call("session.list"))["sessions"]
                assert len(listed) == len(sids)
        assert refused is not None, f"{NOFILE} fds held 200 open sessions?"
        assert "too many files open" in refused.message and str(NOFILE) in refused.message, refused
        assert "free space" not in refused.message, refused
        # Take every fd left (dshd accepts these connections until EMFILE), so the list
        # cannot even read the sessions directory: it still answers, every session in it.
        socks = []
        try:
            with trio.fail_after(60):
                while len(os.listdir(f"/proc/{d.pid}/fd")) < NOFILE:
                    s = socket.socket(socket.AF_UNIX)
                    socks.append(s)
                    s.connect(str(d.socket))
                    await trio.sleep(0.01)  # a liveness poll: let the accept loop take it
            listed = (await c.call("session.list"))["sessions"]
            assert {i["sessionId"] for i in listed} == set(sids)
            assert d.proc.poll() is None
        finally:
            for s in socks:
                s.close()
