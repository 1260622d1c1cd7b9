"""A fake JSON-RPC peer for the failure injection a real dshd cannot produce -- NOT dshd.

It listens on a real Unix socket, speaks NDJSON JSON-RPC 2.0 and answers only what a test
scripts: ``handlers`` maps a method to ``async fn(params) -> result`` (raise ``FakeError`` for
an error answer); ``subscribe`` answers with a new subscription and, in the same write, the
batches ``on_subscribe`` gives for it (default: the base batch of ``lane``); ``publish`` sends
a batch to every subscription, ``notify`` one with any seq (a gap). It knows nothing of
sessions, calls or approvals: a test that needs those runs against a real daemon
(``dshd.testing.DshdProcess``). Used for: seq gaps and bad batches, a lane that disagrees with
``session.get``, a decision refused while the lane still shows the request, a call that
settled between two lane flushes, a spill path that cannot be read, error answers a test
cannot provoke (``STORAGE_FAILURE`` on ``tool.run``, damaged or locked sessions).
"""

from __future__ import annotations

import json
import socket as _socket
from typing import Any, Awaitable, Callable

import trio


class FakeError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def lane(tools: dict | None = None, recent: list | None = None,
         approvals: dict | None = None) -> dict:
    return {"session": {"sessionId": "s1", "title": "t", "cwd": "/", "approvalPolicy": "ask",
                        "sandbox": "workspace-write"},
            "tools": tools or {}, "approvals": approvals or {}, "recent": recent or [],
            "turn": None}


def tool_entry(text: str = "", total: int = 0, command: str = "x", state: str = "running") -> dict:
    return {"name": "bash", "args": {"command": command}, "state": state, "startedAt": 0,
            "output": {"content": [{"type": "text", "text": text}], "details": {},
                       "truncation": {"truncated": False, "truncatedBy": None, "totalBytes": total,
                                      "totalLines": 0, "maxBytes": 51200, "maxLines": 2000}}}


def settle_ops(call_id: str, *, exit_code: int | None = 0, error_code: str | None = None,
               keep: bool = False) -> list:
    """The batch of a call that left the lane: into ``recent`` (and out of ``tools``)."""
    ops: list = [["p", ["recent"], 0, 0, [{"callId": call_id, "name": "bash",
                                            "isError": bool(error_code), "exitCode": exit_code,
                                            "errorCode": error_code}]]]
    return ops if keep else ops + [["d", ["tools", call_id]]]


Handler = Callable[[Any], Awaitable[Any]]


class FakeDshd:
    """Serve with ``await nursery.start(fake.serve)``; script it before the client comes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: list[tuple[str, Any]] = []
        self.lane = lane()
        self.handlers: dict[str, Handler] = {"initialize": self._initialize,
                                             "unsubscribe": self._unsubscribe}
        #: Batches for the n-th subscription, right after its response (default: the base).
        self.on_subscribe: list[Callable[[int], list[list]]] = []
        self.subscriptions = 0
        self._streams: list[trio.SocketStream] = []
        self._subs: dict[str, tuple[trio.SocketStream, list[int]]] = {}
        self._lock = trio.Lock()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        await sock.bind(self.path)
        sock.listen(16)
        async with trio.open_nursery() as nursery:
            #: For tasks a script starts (a call that plays after ``tool.run`` answered).
            self.nursery = nursery
            await nursery.start(trio.serve_listeners, self._handle, [trio.SocketListener(sock)])
            task_status.started()

    async def _handle(self, stream: trio.SocketStream) -> None:
        self._streams.append(stream)
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
                    nursery.start_soon(self._answer, stream, json.loads(line))
            nursery.cancel_scope.cancel()
        for sub_id in [s for s, (owner, _) in self._subs.items() if owner is stream]:
            del self._subs[sub_id]

    async def _answer(self, stream: trio.SocketStream, msg: dict) -> None:
        method, params = msg["method"], msg.get("params")
        self.requests.append((method, params))
        after: list[bytes] = []
        try:
            if method == "subscribe":
                result, after = self._subscribe(stream)
            elif method in self.handlers:
                result = await self.handlers[method](params)
            else:
                raise FakeError(-32601, f"method {method} not found")
            reply: dict = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
        except FakeError as exc:
            error = {"code": exc.code, "message": exc.message}
            if exc.data is not None:
                error["data"] = exc.data
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": error}
        # The response and the batches after it go out in ONE write (the client's reader sees
        # them back to back: the subscribe/registration race).
        await self._send(stream, json.dumps(reply).encode() + b"\n" + b"".join(after))

    def _subscribe(self, stream: trio.SocketStream) -> tuple[dict, list[bytes]]:
        index, sub_id = self.subscriptions, f"sub{self.subscriptions}"
        self.subscriptions += 1
        self._subs[sub_id] = (stream, [-1])
        batches = (self.on_subscribe[index](index) if index < len(self.on_subscribe)
                   else [[["r", self.lane]]])
        return {"subscriptionId": sub_id}, [self._batch(sub_id, ops) for ops in batches]

    def _batch(self, sub_id: str, ops: list, seq: int | None = None) -> bytes:
        seqs = self._subs[sub_id][1] if sub_id in self._subs else [-1]
        seqs[0] = seqs[0] + 1 if seq is None else seq
        return json.dumps({"jsonrpc": "2.0", "method": "stream", "params": {
            "subscriptionId": sub_id, "seq": seqs[0], "ops": ops}}).encode() + b"\n"

    async def _send(self, stream: trio.SocketStream, data: bytes) -> None:
        try:
            async with self._lock:
                await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def notify(self, sub_id: str, ops: list, *, seq: int | None = None) -> None:
        """One batch to ``sub_id`` (or to the first connection, for a stranger's id)."""
        stream = self._subs[sub_id][0] if sub_id in self._subs else self._streams[0]
        await self._send(stream, self._batch(sub_id, ops, seq))

    async def publish(self, ops: list) -> None:
        for sub_id in list(self._subs):
            await self.notify(sub_id, ops)

    async def close_connections(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()

    async def _initialize(self, params: Any) -> dict:
        return {"protocolVersion": 1, "server": {"name": "fake-dshd", "version": "0"},
                "sandbox": {"provider": "bwrap", "completeness": "full"}}

    async def _unsubscribe(self, params: Any) -> dict:
        self._subs.pop(params["subscriptionId"], None)
        return {}
