"""Transport and typed calls against a fake JSON-RPC server on a real Unix socket."""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import socket
import tempfile

import pytest
import trio
import trio.testing

from client.api import DaemonNotRunning, connect
from client.mirror import MirrorBroken
from client.subscription import MAX_RESTARTS_IN_A_ROW
from client.transport import ConnectionLost, Inbox, open_connection
from fake_dshd import FakeDshd, lane
from protocol.rpc import RpcError


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="dsh-t-", dir="/tmp")  # short: AF_UNIX paths are ≤ 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def fake(sock_dir, nursery):
    server = FakeDshd(os.path.join(sock_dir, "fake.sock"))
    await nursery.start(server.serve)
    return server


# ---------------------------------------------------------------------- connecting
async def test_missing_socket_is_daemon_not_running_with_how_to_start(sock_dir):
    path = os.path.join(sock_dir, "nope.sock")
    with pytest.raises(DaemonNotRunning) as info:
        async with connect(path):
            pass  # pragma: no cover
    message = str(info.value)
    assert message == (f"dshd is not running at {path}; start it with `dshd` "
                       "(or `systemctl --user start dshd`)")
    assert str(info.value.path) == path


async def test_stale_socket_that_refuses_is_daemon_not_running(sock_dir):
    path = os.path.join(sock_dir, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays, nobody listens
    with pytest.raises(DaemonNotRunning):
        async with connect(path):
            pass  # pragma: no cover


async def test_socket_path_from_environment(fake, monkeypatch):
    monkeypatch.setenv("DSH_SOCKET", fake.path)
    async with connect() as c:
        assert str(c.socket_path) == fake.path
        assert c.server["server"]["name"] == "fake-dshd"
    method, params = fake.requests[0]
    assert method == "initialize"
    assert params["protocolVersion"] == 1
    assert params["client"]["name"] == "dsh"
    assert params["capabilities"] == {"approvals": False}


async def test_error_line_before_close_is_raised_to_initialize(fake):
    fake.reject_with = (-32001, "permission denied: uid 1234 is not allowed")
    with pytest.raises(RpcError) as info:
        async with connect(fake.path):
            pass  # pragma: no cover
    assert info.value.code == -32001
    assert "permission denied" in info.value.message


# ---------------------------------------------------------------------- calls
async def test_rpc_error_maps_code_message_and_data(fake):
    async with connect(fake.path) as c:
        with pytest.raises(RpcError) as info:
            await c.call("echo", {"error": [-32004, "session x not found", {"code": "GONE"}]})
        assert (info.value.code, info.value.message, info.value.data) == (
            -32004, "session x not found", {"code": "GONE"})
        with pytest.raises(RpcError) as info:
            await c.call("no.such.method")
        assert info.value.code == -32601
        # The connection is still good after errors.
        assert await c.call("echo", {"n": 1}) == {"n": 1}


async def test_many_concurrent_requests_are_matched_by_id(fake):
    rng = random.Random(7)
    results: dict[int, object] = {}
    async with connect(fake.path) as c:

        async def one(i: int) -> None:
            results[i] = await c.call("echo", {"n": i, "delay": rng.random() * 0.05})

        async with trio.open_nursery() as nursery:
            for i in range(300):
                nursery.start_soon(one, i)
        assert c.connection.statistics()["pending"] == 0
    assert results == {i: {"n": i} for i in range(300)}


async def test_cancelled_call_does_not_disturb_the_others(fake):
    async with connect(fake.path) as c:
        with trio.move_on_after(0.01):
            await c.call("echo", {"n": 1, "delay": 0.2})
        assert await c.call("echo", {"n": 2}) == {"n": 2}


async def test_typed_methods_send_the_spec_params(fake):
    fake.events = [{"seq": i, "time": 0, "type": "x", "data": {}} for i in range(25)]
    async with connect(fake.path) as c:
        assert await c.create_session("/tmp", title="t", approval_policy="never") == "s1"
        assert await c.status() == (await c.call("daemon.status"))
        seen = [e["seq"] async for e in c.iter_events("s1", after_seq=3, page_size=10)]
        assert seen == list(range(4, 25))
        fake.call_result = {"isError": False, "content": "", "details": {"exitCode": 0},
                            "exitCode": 0}
        assert await c.run_tool("s1", "echo hi", call_id="k1", timeout=5) == "k1"
        assert (await c.wait("s1", "k1"))["exitCode"] == 0
        assert await c.cancel("s1", "k1") is True
    sent = dict(fake.requests)
    assert sent["session.create"] == {"cwd": "/tmp", "title": "t", "approvalPolicy": "never"}
    assert sent["tool.run"] == {"sessionId": "s1", "name": "bash", "approved": True,
                                "arguments": {"command": "echo hi", "timeout": 5}, "callId": "k1"}
    pages = [p for m, p in fake.requests if m == "session.events"]
    assert [p["afterSeq"] for p in pages] == [3, 13, 23]


async def test_server_closing_fails_waiting_calls_with_connection_lost(fake):
    async with connect(fake.path) as c:
        async def close_soon():
            await trio.sleep(0.02)
            for conn in fake._conns:
                await conn.stream.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(close_soon)
            with pytest.raises(ConnectionLost):
                await c.call("echo", {"delay": 10})
        with pytest.raises(ConnectionLost):
            await c.call("echo", {})


# ---------------------------------------------------------------------- streams
async def test_notifications_are_routed_to_their_subscription(fake):
    fake.on_subscribe = [lambda i: [
        [["r", lane()]],
        [["s", ["tools", "c1"], {"name": "bash"}]],
        [["s", ["turn"], {"turnId": "t", "state": "running"}]],
    ]]
    async with connect(fake.path) as c:
        sub = await c.subscribe("s1")
        assert sub.subscription_id == "sub0"
        # A notification for a subscription nobody holds is dropped, not misrouted.
        await fake._conns[0].notify_stream("not-ours", [["r", {"bad": 1}]], seq=0)
        views = []
        async for view in sub:
            views.append(copy.deepcopy(view))  # the view is the mirror's live value
            if len(views) == 3:
                break
        assert views[0]["tools"] == {} and views[2]["tools"]["c1"] == {"name": "bash"}
        assert views[2]["turn"] == {"turnId": "t", "state": "running"}
        assert sub.mirror.seq == 2 and sub.resubscribes == 0
        await sub.aclose()
    assert ("unsubscribe", {"subscriptionId": "sub0"}) in fake.requests


async def test_subscribe_to_unknown_session_is_an_rpc_error(fake):
    async with connect(fake.path) as c:
        with pytest.raises(RpcError) as info:
            await c.subscribe("missing")
        assert info.value.code == -32004


async def test_seq_gap_resubscribes_and_continues_from_a_new_base(fake):
    fake.on_subscribe = [
        lambda i: [[["r", lane()]], [["s", ["turn"], 1]]],
        lambda i: [[["r", lane(recent=[{"callId": "x"}])]]],
    ]
    async with connect(fake.path) as c:
        sub = await c.subscribe("s1")
        assert (await sub.next_view())["tools"] == {}
        assert (await sub.next_view())["turn"] == 1
        await fake._conns[0].notify_stream("sub0", [["s", ["turn"], 3]], seq=5)  # a gap
        view = await sub.next_view()
        assert view["recent"] == [{"callId": "x"}] and view["turn"] is None
        assert sub.resubscribes == 1 and sub.subscription_id == "sub1"
        assert isinstance(sub.last_restart_reason, MirrorBroken)
    assert ("unsubscribe", {"subscriptionId": "sub0"}) in fake.requests


async def test_bad_batch_resubscribes(fake):
    fake.on_subscribe = [
        lambda i: [[["r", lane()]], [["a", 0, "x"]]],  # undefined ref
        lambda i: [[["r", lane()]]],
    ]
    async with connect(fake.path) as c:
        sub = await c.subscribe("s1")
        await sub.next_view()
        await sub.next_view()
        assert sub.resubscribes == 1 and "ref" in str(sub.last_restart_reason)


async def test_overflow_marks_the_subscription_for_resubscribe(fake):
    many = [[["r", lane()]]] + [[["s", ["turn"], n]] for n in range(1, 40)]
    fake.on_subscribe = [lambda i: many, lambda i: [[["r", lane(recent=[{"callId": "new"}])]]]]
    async with connect(fake.path) as c:
        sub = await c.subscribe("s1", bound=8)
        await trio.sleep(0.05)  # the reader receives all 40 batches; nobody consumes
        view = await sub.next_view()
        assert view["recent"] == [{"callId": "new"}]
        assert sub.resubscribes == 1 and sub.subscription_id == "sub1"
        # The reader was never blocked: calls still answer.
        assert await c.call("echo", {"n": 5}) == {"n": 5}


async def test_endless_breakage_gives_up(fake):
    fake.on_subscribe = [lambda i: [[["a", ["x"], "no base"]]]] * (MAX_RESTARTS_IN_A_ROW + 2)
    async with connect(fake.path) as c:
        sub = await c.subscribe("s1")
        with pytest.raises(MirrorBroken, match="gave up"):
            await sub.next_view()


async def test_subscription_sees_connection_lost(fake):
    async with connect(fake.path) as c:
        sub = await c.subscribe("s1")
        await sub.next_view()
        await fake._conns[0].stream.aclose()
        with pytest.raises(ConnectionLost):
            await sub.next_view()


# ---------------------------------------------------------------------- framing (memory streams)
async def _answer_first_request(server_stream) -> int:
    data = b""
    while b"\n" not in data:
        data += await server_stream.receive_some(4096)
    request = json.loads(data.split(b"\n", 1)[0])
    return request["id"]


async def test_lines_split_anywhere_and_joined_in_one_chunk_are_framed():
    client_stream, server_stream = trio.testing.memory_stream_pair()
    async with open_connection(client_stream) as conn:
        inbox = Inbox(16)
        conn.register_inbox("s", inbox)

        async def server():
            rid = await _answer_first_request(server_stream)
            note = lambda seq: json.dumps({"jsonrpc": "2.0", "method": "stream", "params": {  # noqa: E731
                "subscriptionId": "s", "seq": seq, "ops": [["r", "é" * seq]]}}).encode() + b"\n"
            reply = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"ok": "ü"}}).encode() + b"\n"
            blob = note(0) + reply + note(1) + b"\n" + note(2)
            for i in range(len(blob)):  # one byte at a time
                await server_stream.send_all(blob[i:i + 1])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(server)
            assert await conn.call("x") == {"ok": "ü"}
        assert [await inbox.get() for _ in range(3)] == [
            (0, [["r", ""]]), (1, [["r", "é"]]), (2, [["r", "éé"]])]


async def test_a_line_over_the_limit_ends_the_connection():
    client_stream, server_stream = trio.testing.memory_stream_pair()
    async with open_connection(client_stream, max_line_bytes=1000) as conn:

        async def server():
            await _answer_first_request(server_stream)
            await server_stream.send_all(b"x" * 5000)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(server)
            with pytest.raises(ConnectionLost, match="over 1000 bytes"):
                await conn.call("x")


async def test_an_invalid_line_ends_the_connection_with_a_clear_error():
    client_stream, server_stream = trio.testing.memory_stream_pair()
    async with open_connection(client_stream) as conn:

        async def server():
            await _answer_first_request(server_stream)
            await server_stream.send_all(b"{not json\n")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(server)
            with pytest.raises(ConnectionLost, match="invalid message"):
                await conn.call("x")
