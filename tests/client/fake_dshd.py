"""A fake JSON-RPC server for the client tests -- NOT dshd.

It listens on a real Unix socket, speaks NDJSON JSON-RPC 2.0 and answers a handful of methods
from canned data: enough to drive the client's transport, subscriptions and the ``dsh`` CLI
through their paths (errors, out-of-order responses, stream notifications, overflow, a call
whose output streams and settles). It knows nothing of sessions, storage or processes; every
behaviour a test needs is set on the instance before the client connects.
"""

from __future__ import annotations

import json
import os
import socket as _socket
from typing import Any, Callable

import trio


class FakeError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def lane(tools: dict | None = None, recent: list | None = None) -> dict:
    return {"session": {"sessionId": "s1", "title": "t", "cwd": "/", "approvalPolicy": "ask",
                        "sandbox": "workspace-write"},
            "tools": tools or {}, "approvals": {}, "recent": recent or [], "turn": None}


def tool_entry(text: str = "", total: int = 0, command: str = "x") -> dict:
    return {"name": "bash", "args": {"command": command}, "state": "running", "startedAt": 0,
            "output": {"content": [{"type": "text", "text": text}], "details": {},
                       "truncation": {"truncated": False, "truncatedBy": None, "totalBytes": total,
                                      "totalLines": 0, "maxBytes": 51200, "maxLines": 2000}}}


class FakeConn:
    def __init__(self, server: "FakeDshd", stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.lock = trio.Lock()
        self.seq: dict[str, int] = {}

    async def send(self, obj: Any) -> None:
        async with self.lock:
            await self.stream.send_all(json.dumps(obj).encode() + b"\n")

    async def send_raw(self, data: bytes) -> None:
        async with self.lock:
            await self.stream.send_all(data)

    async def notify_stream(self, sub_id: str, ops: list, *, seq: int | None = None) -> None:
        if seq is None:
            seq = self.seq.get(sub_id, -1) + 1
        self.seq[sub_id] = seq
        await self.send({"jsonrpc": "2.0", "method": "stream",
                         "params": {"subscriptionId": sub_id, "seq": seq, "ops": ops}})


class FakeDshd:
    """Serve with ``await nursery.start(fake.serve)``; tune the attributes first."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: list[tuple[str, Any]] = []
        #: Sent as one error line (id null) to every new connection, which is then closed.
        self.reject_with: tuple[int, str] | None = None
        #: method -> async fn(conn, params) -> result (raise FakeError for an error answer).
        self.handlers: dict[str, Callable[..., Any]] = {
            "initialize": self._initialize,
            "echo": self._echo,
            "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe,
            "session.create": self._session_create,
            "session.list": self._session_list,
            "session.events": self._session_events,
            "daemon.status": self._status,
            "tool.run": self._tool_run,
            "tool.wait": self._tool_wait,
            "tool.cancel": self._tool_cancel,
        }
        #: Batches each new subscription gets right after its response (list of op batches).
        self.on_subscribe: list[Callable[[int], list[list]]] = []
        self.subscriptions = 0
        self.sessions: list[dict] = []
        self.events: list[dict] = []
        # A scripted tool call: batches published after tool.run, then the result.
        self.call_batches: list[list] = []
        self.call_delay = 0.0
        self.call_hold = False  # keep "running" until tool.cancel
        self.call_quiet = False  # the call shows in the lane only in "recent" (settled at once)
        self.call_result: dict = {}
        self.settled = trio.Event()
        self.cancelled = False
        self._conns: list[FakeConn] = []
        self._subs: dict[str, FakeConn] = {}

    # -- serving -------------------------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        await sock.bind(self.path)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(trio.serve_listeners, self._handle, [listener])
            task_status.started()

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = FakeConn(self, stream)
        self._conns.append(conn)
        if self.reject_with is not None:
            code, message = self.reject_with
            await conn.send({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})
            await stream.aclose()
            return
        buf = b""
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    nursery.start_soon(self._answer, conn, msg)
            nursery.cancel_scope.cancel()

    async def _answer(self, conn: FakeConn, msg: dict) -> None:
        method, params = msg["method"], msg.get("params")
        self.requests.append((method, params))
        handler = self.handlers.get(method)
        after: list = []
        try:
            if handler is None:
                raise FakeError(-32601, f"method {method} not found")
            result = await handler(conn, params)
            if isinstance(result, tuple):
                result, after = result
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
        except FakeError as exc:
            error = {"code": exc.code, "message": exc.message}
            if exc.data is not None:
                error["data"] = exc.data
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": error}
        # Response and the notifications after it go out in ONE write, so that the client's
        # reader sees them back to back (the subscribe/registration race).
        data = json.dumps(reply).encode() + b"\n"
        for sub_id, ops in after:
            seq = conn.seq.get(sub_id, -1) + 1
            conn.seq[sub_id] = seq
            data += json.dumps({"jsonrpc": "2.0", "method": "stream", "params": {
                "subscriptionId": sub_id, "seq": seq, "ops": ops}}).encode() + b"\n"
        try:
            await conn.send_raw(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    # -- methods -------------------------------------------------------------------------
    async def _initialize(self, conn, params):
        if params.get("protocolVersion") != 1:
            raise FakeError(-32003, "unsupported protocol version")
        return {"protocolVersion": 1, "server": {"name": "fake-dshd", "version": "0"},
                "sandbox": {"provider": "none", "completeness": "none"}}

    async def _echo(self, conn, params):
        await trio.sleep(params.get("delay", 0))
        if "error" in params:
            raise FakeError(*params["error"])
        return {"n": params.get("n")}

    async def _subscribe(self, conn, params):
        if params.get("sessionId") == "missing":
            raise FakeError(-32004, "session missing not found; `dsh sessions` lists the sessions")
        index = self.subscriptions
        self.subscriptions += 1
        sub_id = f"sub{index}"
        self._subs[sub_id] = conn
        if index < len(self.on_subscribe):
            batches = self.on_subscribe[index](index)
        else:
            batches = [[["r", self.current_lane]]]
        return {"subscriptionId": sub_id}, [(sub_id, b) for b in batches]

    async def _unsubscribe(self, conn, params):
        self._subs.pop(params["subscriptionId"], None)
        return {}

    async def _session_create(self, conn, params):
        if not os.path.isabs(params.get("cwd", "")):
            raise FakeError(-32602, "cwd must be absolute")
        return {"sessionId": "s1"}

    async def _session_list(self, conn, params):
        return {"sessions": self.sessions}

    async def _session_events(self, conn, params):
        after, limit = params.get("afterSeq", -1), params.get("limit", 1000)
        page = [e for e in self.events if e["seq"] > after][:limit]
        return {"events": page, "lastSeq": self.events[-1]["seq"] if self.events else -1}

    async def _status(self, conn, params):
        return {"version": "0", "pid": 1, "startedAt": 0, "sessionsOpen": 1, "connections": 1,
                "subscriptions": len(self._subs), "sandbox": {"provider": "none"}}

    # -- one scripted call ---------------------------------------------------------------
    current_lane: dict = lane()

    async def _publish(self, ops: list) -> None:
        for sub_id, conn in list(self._subs.items()):
            try:
                await conn.notify_stream(sub_id, ops)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subs.pop(sub_id, None)

    async def _tool_run(self, conn, params):
        call_id = params.get("callId") or "minted"
        self.play(call_id)
        return {"callId": call_id}

    def play(self, call_id: str, *, announce: bool = True) -> None:
        """Play the scripted call (``announce``: it enters the lane first)."""
        self.call_id = call_id
        self._nursery.start_soon(self._play, call_id, announce and not self.call_quiet)

    async def _play(self, call_id: str, announce: bool = True) -> None:
        if announce:
            await self._publish([["s", ["tools", call_id], tool_entry()]])
        for batch in self.call_batches:
            await trio.sleep(self.call_delay)
            await self._publish(batch)
        if self.call_hold:
            while not self.cancelled:
                await trio.sleep(0.01)
        result = dict(self.call_result, callId=call_id)
        settle = [["p", ["recent"], 0, 0, [{
            "callId": call_id, "name": "bash", "isError": result.get("isError", False),
            "exitCode": result.get("exitCode"), "errorCode": result.get("errorCode")}]]]
        if not self.call_quiet:
            settle.append(["d", ["tools", call_id]])
        await self._publish(settle)
        self.final_result = result
        self.settled.set()

    async def _tool_wait(self, conn, params):
        await self.settled.wait()
        return self.final_result

    async def _tool_cancel(self, conn, params):
        self.cancelled = True
        if self.call_hold:
            self.call_result = {"isError": True, "content": "partial", "errorCode": "TOOL_CANCELLED",
                                "details": {"exitCode": 143}, "exitCode": 143}
        return {"cancelled": True}
