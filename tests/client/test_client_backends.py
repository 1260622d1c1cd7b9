"""The client library (transport, api, subscription) on trio AND on asyncio, against a real
dshd and, for the framing, against a real socket pair with a hand-written peer.

Each test is a plain function run once per backend (``conftest.on``).
"""

from __future__ import annotations

import json
import socket
import tempfile
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest

from client.api import DaemonNotRunning, DaemonUnresponsive, connect
from client.transport import ConnectionLost, Inbox, InboxOverflow, open_connection
from conftest import on, start_dshd, stop_dshd
from protocol import methods as m
from protocol.events import ToolResultEvent
from protocol.lane import ToolResult
from protocol.rpc import RpcError


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="dsh-w-", dir="/tmp"))
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


# ---------------------------------------------------------------------- against dshd
def test_calls_and_errors(backend, real_dshd, workdir):
    async def body():
        async with connect(real_dshd.socket) as c:
            assert c.server["protocolVersion"] == 1
            sid = await c.create_session(workdir, title="t")
            assert sid in [s["sessionId"] for s in await c.list_sessions()]
            cid = await c.run_tool(sid, "printf 'hi\\n'")
            result = await c.wait(sid, cid)
            assert (result["exitCode"], result["content"]) == (0, "hi\n")
            types = [e["type"] async for e in c.iter_events(sid, page_size=2)]
            assert "tool/call" in types and "tool/result" in types
            with pytest.raises(RpcError) as info:
                await c.get_session("no-such-session")
            assert info.value.code == -32004
            # Many requests at once are matched by id, and the connection is still good.
            statuses: list[dict] = []

            async def one() -> None:
                statuses.append(await c.status())

            async with anyio.create_task_group() as tasks:
                for _ in range(50):
                    tasks.start_soon(one)
            assert len(statuses) == 50 and all("pid" in s for s in statuses)
            assert c.connection.statistics()["pending"] == 0

    on(backend, body)


def test_subscription_follows_a_call(backend, real_dshd, workdir):
    async def body():
        async with connect(real_dshd.socket) as c:
            sid = await c.create_session(workdir)
            sub = await c.subscribe(sid)
            base = await sub.next_view()
            assert base["session"]["sessionId"] == sid and sub.mirror.last_ops[0][0] == "r"
            cid = await c.run_tool(sid, "echo one; sleep 0.2; echo two")
            with anyio.fail_after(20):
                async for view in sub:
                    if any(r.get("callId") == cid for r in view["recent"]):
                        break
            assert cid not in view["tools"] and sub.resubscribes == 0
            await sub.aclose()
            with pytest.raises(anyio.ClosedResourceError):
                await sub.next_view()

    on(backend, body)


def test_overflow_resubscribes_from_a_fresh_base(backend, real_dshd, workdir):
    async def body():
        async with connect(real_dshd.socket) as c:
            sid = await c.create_session(workdir)
            sub = await c.subscribe(sid, bound=1)  # the base batch fills it
            cid = await c.run_tool(sid, "echo a; sleep 0.1; echo b")
            await c.wait(sid, cid)  # the reader took every batch meanwhile; nobody consumed
            view = await sub.next_view()
            assert sub.resubscribes == 1 and isinstance(sub.last_restart_reason, InboxOverflow)
            assert sub.mirror.last_ops[0][0] == "r"  # a fresh base batch
            assert any(r.get("callId") == cid for r in view["recent"])

    on(backend, body)


def test_resubscribe_keeps_an_answerer_attached(backend, real_dshd, workdir):
    # Make before break: were the old subscription dropped first, the session would have no
    # answerer for a moment and settle the pending request as APPROVAL_UNAVAILABLE.
    async def body():
        async with connect(real_dshd.socket, approvals=True) as ans, \
                connect(real_dshd.socket) as c:
            sid = await c.create_session(workdir, approval_policy="ask")
            sub = await ans.subscribe(sid)
            await sub.next_view()
            cid = await c.run_tool(sid, "echo ran", approved=False)
            with anyio.fail_after(20):
                async for view in sub:
                    if view["approvals"]:
                        break
            [aid] = view["approvals"]
            old = sub.subscription_id
            await sub.resubscribe()
            assert sub.subscription_id != old
            view = await sub.next_view()
            assert aid in view["approvals"]
            assert await ans.decide(sid, aid, "allow") == "allowed-once"
            assert (await c.wait(sid, cid))["exitCode"] == 0

    on(backend, body)


def test_daemon_dying_fails_the_waiting_call(backend, workdir):
    daemon = start_dshd()

    async def body():
        async with connect(daemon.socket) as c:
            sid = await c.create_session(workdir)
            cid = await c.run_tool(sid, "sleep 100")
            async with anyio.create_task_group() as tasks:
                async def kill_soon() -> None:
                    await anyio.sleep(0.2)
                    await anyio.to_thread.run_sync(daemon.kill9)

                tasks.start_soon(kill_soon)
                with pytest.raises(ConnectionLost):
                    await c.wait(sid, cid)
            with pytest.raises(ConnectionLost):
                await c.status()

    try:
        on(backend, body)
    finally:
        stop_dshd(daemon)


# ---------------------------------------------------------------------- connecting
def test_missing_and_refusing_sockets_are_daemon_not_running(backend, workdir):
    stale = workdir / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # the file stays, nobody listens

    async def body():
        for path in (workdir / "nope.sock", stale):
            with pytest.raises(DaemonNotRunning) as info:
                async with connect(path):
                    pass  # pragma: no cover
            assert str(info.value) == (f"dshd is not running at {path}; start it with `dshd` "
                                       "(or `systemctl --user start dshd`)")

    on(backend, body)


def test_a_socket_nobody_serves_is_unresponsive(backend, workdir, monkeypatch):
    path = workdir / "mute.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)  # the kernel queues connections; nobody accepts or answers
    monkeypatch.setenv("DSH_CONNECT_TIMEOUT", "0.3")

    async def body():
        with anyio.fail_after(5):
            with pytest.raises(DaemonUnresponsive):
                async with connect(path):
                    pass  # pragma: no cover

    try:
        on(backend, body)
    finally:
        listener.close()


# ---------------------------------------------------------------------- framing (socket pair)
async def _pair() -> tuple[anyio.abc.ByteStream, socket.socket]:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.setblocking(False)
    return await anyio.abc.UNIXSocketStream.from_socket(mine), theirs


async def _first_request_id(peer: anyio.abc.ByteStream) -> int:
    data = b""
    while b"\n" not in data:
        data += await peer.receive()
    return json.loads(data.split(b"\n", 1)[0])["id"]


def test_lines_split_anywhere_and_joined_in_one_chunk_are_framed(backend):
    async def body():
        stream, raw = await _pair()
        peer = await anyio.abc.UNIXSocketStream.from_socket(raw)
        async with open_connection(stream) as conn:
            inbox = Inbox(16)
            conn.register_inbox("s", inbox)

            async def server() -> None:
                rid = await _first_request_id(peer)
                note = lambda seq: json.dumps({"jsonrpc": "2.0", "method": "stream", "params": {  # noqa: E731
                    "subscriptionId": "s", "seq": seq, "ops": [["r", "é" * seq]]}}).encode() + b"\n"
                reply = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"ok": "ü"}}).encode()
                blob = note(0) + reply + b"\n" + note(1) + b"\n" + note(2)
                for i in range(len(blob)):  # one byte at a time
                    await peer.send(blob[i:i + 1])

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(server)
                assert await conn.call("x") == {"ok": "ü"}
            assert [await inbox.get() for _ in range(3)] == [
                (0, [["r", ""]]), (1, [["r", "é"]]), (2, [["r", "éé"]])]
        await peer.aclose()

    on(backend, body)


@pytest.mark.parametrize("sent, error", [(b"x" * 5000, "over 1000 bytes"),
                                         (b"{not json\n", "invalid message")])
def test_a_bad_line_ends_the_connection_with_a_clear_error(backend, sent, error):
    async def body():
        stream, raw = await _pair()
        peer = await anyio.abc.UNIXSocketStream.from_socket(raw)
        async with open_connection(stream, max_line_bytes=1000) as conn:

            async def server() -> None:
                await _first_request_id(peer)
                await peer.send(sent)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(server)
                with pytest.raises(ConnectionLost, match=error):
                    await conn.call("x")
        await peer.aclose()

    on(backend, body)


def test_an_error_line_with_null_id_before_close_is_what_calls_raise(backend):
    # What dshd sends a peer it refuses (-32001): the reason, then the end of the stream.
    async def body():
        stream, raw = await _pair()
        peer = await anyio.abc.UNIXSocketStream.from_socket(raw)
        async with open_connection(stream) as conn:

            async def server() -> None:
                await _first_request_id(peer)
                await peer.send(json.dumps({"jsonrpc": "2.0", "id": None, "error": {
                    "code": -32001, "message": "permission denied"}}).encode() + b"\n")
                await peer.aclose()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(server)
                with pytest.raises(RpcError) as info:
                    await conn.call("x")
            assert info.value.code == -32001

    on(backend, body)


def test_inbox_is_bounded_and_marks_overflow(backend):
    async def body():
        inbox = Inbox(2)
        assert inbox.put_nowait(0, []) and inbox.put_nowait(1, [])
        assert not inbox.put_nowait(2, []) and inbox.overflowed and len(inbox) == 0
        with pytest.raises(InboxOverflow):
            await inbox.get()

    on(backend, body)


def test_request_sends_a_params_struct_as_the_daemon_decodes_it(backend, real_dshd, workdir):
    """The client and the daemon share ``protocol.methods``: the params struct goes out, the
    answer comes back as the method's result struct (readable by wire name too), and a
    params struct of another method is refused before anything is sent."""

    async def body():
        async with connect(real_dshd.socket) as c:
            assert isinstance(c.server, m.InitializeResult) and "tool.wait" in c.server.methods
            sid = await c.create_session(workdir)
            info = await c.request("session.get", m.SessionGetParams(session_id=sid))
            assert isinstance(info, m.SessionInfo) and info.session_id == sid
            assert info["sessionId"] == sid and info.last_seq == info["lastSeq"]
            with pytest.raises(TypeError, match="SessionGetParams"):
                await c.request("session.get", m.SubscribeParams(session_id=sid))
            cid = await c.run_tool(sid, "echo typed")
            result = await c.wait(sid, cid)
            assert isinstance(result, ToolResult) and result.content == "typed\n"
            [record] = [e async for e in c.iter_events(sid) if isinstance(e, ToolResultEvent)]
            assert record.data == result  # the recorded result is the answer, struct for struct

    on(backend, body)


def test_closing_a_subscription_when_dshd_goes_away_is_quiet(backend):
    # `dsh run` closes its subscription on the way out, also after dshd stopped under it: the
    # unsubscribe that meets the lost connection must not replace what really happened
    # (the run's "dshd went away" status, 75) with a bare ConnectionLost.
    from client.subscription import Subscription

    async def body():
        stream, raw = await _pair()
        peer = await anyio.abc.UNIXSocketStream.from_socket(raw)
        async with open_connection(stream) as conn:
            sub = Subscription(conn, "s1", request=lambda method, params: conn.call(
                method, msgspec.to_builtins(params)))
            sub.subscription_id = "sub-1"
            sub._inbox = Inbox(16)

            async def server() -> None:
                await _first_request_id(peer)  # the unsubscribe: dshd is gone before answering
                await peer.aclose()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(server)
                await sub.aclose()  # no exception

    on(backend, body)
