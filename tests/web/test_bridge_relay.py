"""The ``/ws`` relay (docs/WEB.md): the JSON-RPC protocol to dshd through a real ``dsh web``
-- initialize, sessions, a subscription's stream, a tool call's output by ``tool.follow``;
raw newlines, malformed JSON and an oversize message; and the close codes when dshd is not
running (4001) or goes away (4000), the bridge staying up for the next connection."""

from __future__ import annotations

import base64
import json
import pytest
import trio
from trio_websocket import ConnectionClosed

from tests.web.bridge_support import LIVENESS_S, sign_in, ws_rpc

pytestmark = pytest.mark.trio


async def cookie_of(bridge) -> str:
    return await trio.to_thread.run_sync(sign_in, bridge)


async def test_sessions_a_stream_and_a_calls_output_through_the_bridge(bridge, tmp_path):
    cookie = await cookie_of(bridge)
    async with ws_rpc(bridge, cookie) as rpc:
        init = await rpc.initialize()
        assert "tool.follow" in init["methods"]
        sid = (await rpc.result("session.create", {"cwd": str(tmp_path)}))["sessionId"]
        listed = await rpc.result("session.list")
        assert sid in [s["sessionId"] for s in listed["sessions"]]
        sub = (await rpc.result("subscribe", {"sessionId": sid}))["subscriptionId"]
        base = await rpc.notification(lambda m: m.get("method") == "stream"
                                      and m["params"]["subscriptionId"] == sub)
        assert base["params"]["seq"] == 0
        run = await rpc.result("tool.run", {
            "sessionId": sid, "name": "bash", "approved": True,
            "arguments": {"command": "printf 'one\\n'; sleep 0.2; printf 'two\\n'"}})
        cid = run["callId"]
        fid = (await rpc.result("tool.follow", {"sessionId": sid, "callId": cid}))["followId"]
        data, eof = b"", None
        while eof is None:
            note = await rpc.notification(lambda m: m.get("method") == "output"
                                          and m["params"]["followId"] == fid)
            p = note["params"]
            if p.get("eof"):
                eof = p
            elif "data" in p:
                assert p["offset"] == len(data)
                data += base64.b64decode(p["data"])
        assert data == b"one\ntwo\n" and eof.get("exitCode") == 0
        # the lane said the call ran: a delta batch after the base one
        delta = await rpc.notification(lambda m: m.get("method") == "stream"
                                       and m["params"]["seq"] > 0)
        assert delta["params"]["subscriptionId"] == sub


async def test_raw_newlines_malformed_json_and_an_oversize_message(bridge):
    cookie = await cookie_of(bridge)
    async with ws_rpc(bridge, cookie) as rpc:
        await rpc.initialize()
        # raw newlines (and CRs) between the tokens of a JSON message: one line to dshd
        await rpc.send_raw('{"jsonrpc": "2.0",\n "id": 7,\r\n "method":\n"session.list",'
                           '\n"params": {}}\n')
        answer = await rpc.answer(7)
        assert "sessions" in answer["result"], answer
        await rpc.send_raw('{"jsonrpc": "2.0", "id": 8, "method": ')
        bad = await rpc.receive()
        assert bad["error"]["code"] == -32700, bad
        assert "result" in await rpc.call("session.list")  # the connection stayed open
        async with ws_rpc(bridge, cookie) as other:
            await other.initialize()
            big = '{"jsonrpc": "2.0", "id": 9, "method": "session.list", "params": {"x": "' \
                + "a" * (16 * 1024 * 1024) + '"}}'
            await rpc.send_raw(big)
            with pytest.raises(ConnectionClosed) as closed:
                with trio.fail_after(LIVENESS_S):
                    while True:
                        await rpc.ws.get_message()
            assert closed.value.reason.code == 1009, closed.value.reason
            assert "result" in await other.call("session.list")  # others keep being served
            # The log does not claim the browser closed it (hypercorn's 1006 hides who did).
            with trio.fail_after(LIVENESS_S):
                while "hypercorn closed it 1009 for a message over 16 MiB" not in bridge.log:
                    await trio.sleep(0.05)
            assert "closed by the browser (1006)" not in bridge.log
    async with ws_rpc(bridge, cookie) as again:
        assert (await again.initialize())["server"]["name"] == "dshd"


async def test_a_raw_newline_inside_a_json_string_is_refused_and_runs_nothing(bridge, tmp_path):
    """Finding: the bridge replaced raw line breaks by spaces before it looked, so invalid JSON
    (a raw LF inside a string) became valid JSON of another command: ``touch ran-one<LF>touch
    ran-two`` ran as ``touch ran-one touch ran-two``. Now such a message is answered ``-32700``
    (id null) by the bridge and nothing reaches dshd; a raw CR inside a string likewise."""
    cookie = await cookie_of(bridge)
    async with ws_rpc(bridge, cookie) as rpc:
        await rpc.initialize()
        sid = (await rpc.result("session.create", {"cwd": str(tmp_path)}))["sessionId"]
        for i, brk in enumerate(("\n", "\r", "\r\n")):
            await rpc.send_raw(
                '{"jsonrpc": "2.0", "id": %d, "method": "tool.run", "params": {"sessionId": "%s", '
                '"name": "bash", "approved": true, "arguments": {"command": '
                '"touch ran-one%stouch ran-two"}}}' % (50 + i, sid, brk))
            bad = await rpc.receive()
            assert bad.get("id", "absent") is None and bad["error"]["code"] == -32700, bad
            assert "nothing was sent to dshd" in bad["error"]["message"], bad
        events = (await rpc.result("session.events", {"sessionId": sid}))["events"]
        assert [e for e in events if e.get("type") == "tool/call"] == []
        assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing ran
    assert "refused a message with raw line breaks" in bridge.log


async def _closed_code(rpc) -> tuple[int, str | None]:
    with pytest.raises(ConnectionClosed) as closed:
        with trio.fail_after(LIVENESS_S):
            while True:
                await rpc.ws.get_message()
    return closed.value.reason.code, closed.value.reason.reason


async def test_dshd_gone_closes_4001_or_4000_and_the_bridge_stays_up(bridge, web_daemon):
    cookie = await cookie_of(bridge)
    async with ws_rpc(bridge, cookie) as rpc:
        await rpc.initialize()
        await trio.to_thread.run_sync(web_daemon.stop)
        code, reason = await _closed_code(rpc)
        assert (code, reason) == (4000, "dshd closed the connection")
    async with ws_rpc(bridge, cookie) as rpc:  # accepted, then closed: dshd is not running
        code, reason = await _closed_code(rpc)
        assert code == 4001 and reason == "dshd is not running"
        assert len(reason.encode()) <= 123
    assert bridge.running
    await trio.to_thread.run_sync(web_daemon.start)
    async with ws_rpc(bridge, cookie) as rpc:
        assert (await rpc.initialize())["server"]["name"] == "dshd"
        assert "sessions" in await rpc.result("session.list")


async def test_the_browser_closing_ends_its_dshd_connection(bridge, web_daemon):
    cookie = await cookie_of(bridge)
    for _ in range(3):
        async with ws_rpc(bridge, cookie) as rpc:
            await rpc.initialize()
    async with ws_rpc(bridge, cookie) as rpc:
        await rpc.initialize()
        # Only the connection asking stays open: the closed WebSockets took theirs with them.
        with trio.fail_after(LIVENESS_S):
            while (status := await rpc.result("daemon.status"))["connections"] != 1:
                await trio.sleep(0.05)
        assert status["connections"] == 1


def _kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


async def test_a_browser_that_does_not_read_holds_the_bridge_to_a_bounded_buffer(bridge, tmp_path):
    """Back-pressure: 128 MiB of output followed by a WebSocket that stops reading; the
    bridge's peak memory grows by far less than the output (it stops reading dshd), and
    every byte arrives, in order, once the browser reads again."""
    total = 128 * 1024 * 1024
    cookie = await cookie_of(bridge)
    async with ws_rpc(bridge, cookie) as rpc:
        await rpc.initialize()
        sid = (await rpc.result("session.create", {"cwd": str(tmp_path)}))["sessionId"]
        run = await rpc.result("tool.run", {
            "sessionId": sid, "name": "bash", "approved": True,
            "arguments": {"command": f"head -c {total} /dev/zero | tr '\\0' a"}})
        done = await rpc.result("tool.wait", {"sessionId": sid, "callId": run["callId"]})
        assert done.get("exitCode", 0) == 0, done
        before = _kib(bridge.proc.pid, "VmRSS")
        fid = (await rpc.result("tool.follow", {"sessionId": sid,
                                                "callId": run["callId"]}))["followId"]
        await trio.sleep(3)  # the browser reads nothing for a while
        held = _kib(bridge.proc.pid, "VmHWM") - before
        got, eof = 0, False
        while not eof:
            p = (await rpc.notification(lambda m: m.get("method") == "output"
                                        and m["params"]["followId"] == fid))["params"]
            if p.get("eof"):
                eof = True
            elif "data" in p:
                assert p["offset"] == got
                got += len(base64.b64decode(p["data"]))
        assert got == total
        assert held < 48 * 1024, f"the bridge grew by {held} KiB while the browser did not read"


async def test_a_binary_message_closes_1003_text_only(bridge):
    cookie = await cookie_of(bridge)
    async with ws_rpc(bridge, cookie) as rpc:
        await rpc.initialize()
        await rpc.ws.send_message(b'{"jsonrpc": "2.0", "id": 1, "method": "session.list"}')
        code, reason = await _closed_code(rpc)
        assert (code, reason) == (1003, "text messages only")


async def test_a_dshd_line_over_16_mib_closes_1009_and_others_go_on(bridge, tmp_path):
    """dshd answers a batch as one array line: four 4 MiB ``tool.read``s (base64: ~22 MiB)
    make a line over the bridge's bound, which is never relayed in part."""
    cookie = await cookie_of(bridge)
    async with ws_rpc(bridge, cookie) as rpc, ws_rpc(bridge, cookie) as other:
        await rpc.initialize()
        await other.initialize()
        sid = (await rpc.result("session.create", {"cwd": str(tmp_path)}))["sessionId"]
        run = await rpc.result("tool.run", {
            "sessionId": sid, "name": "bash", "approved": True,
            "arguments": {"command": "head -c 16777216 /dev/zero | tr '\\0' a"}})
        await rpc.result("tool.wait", {"sessionId": sid, "callId": run["callId"]})
        chunk = 4 * 1024 * 1024
        await rpc.send_raw(json.dumps([
            {"jsonrpc": "2.0", "id": 100 + i, "method": "tool.read",
             "params": {"sessionId": sid, "callId": run["callId"], "offset": i * chunk,
                        "limit": chunk}} for i in range(4)]))
        code, _ = await _closed_code(rpc)
        assert code == 1009
        assert "result" in await other.call("session.list")
    assert "over 16 MiB" in bridge.log
