"""A fake JSON-RPC server for the client tests -- NOT dshd.

It listens on a real Unix socket, speaks NDJSON JSON-RPC 2.0 and answers a handful of methods
from canned data: enough to drive the client's transport, subscriptions and the ``dsh`` CLI
through their paths (errors, out-of-order responses, stream notifications, overflow, a call
whose output streams and settles, a call that waits for approval). It knows nothing of
sessions, storage or processes; every behaviour a test needs is set on the instance before the
client connects.

Approvals: ``tool.run`` without ``approved`` asks (``_ask``): the call enters the lane
``waiting-approval`` and, with an answerer attached (a connection initialized with
``capabilities.approvals`` holding a subscription, or ``assume_answerer``), an ``approvals``
entry appears until ``approval.decide`` (or ``decide_elsewhere``) decides it; allowed, the
scripted call plays; otherwise it settles without running, with the outcome's errorCode.
``pending_ask`` puts such a request in the base lane before anyone connects.
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


def tool_entry(text: str = "", total: int = 0, command: str = "x", state: str = "running") -> dict:
    return {"name": "bash", "args": {"command": command}, "state": state, "startedAt": 0,
            "output": {"content": [{"type": "text", "text": text}], "details": {},
                       "truncation": {"truncated": False, "truncatedBy": None, "totalBytes": total,
                                      "totalLines": 0, "maxBytes": 51200, "maxLines": 2000}}}


class FakeConn:
    def __init__(self, server: "FakeDshd", stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.lock = trio.Lock()
        self.seq: dict[str, int] = {}
        self.capabilities: dict = {}

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
            "session.get": self._session_get,
            "session.events": self._session_events,
            "session.setApprovalPolicy": self._set_policy,
            "approval.decide": self._approval_decide,
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
        #: callIds tool.run answers ``existing: true`` for (nothing is played).
        self.existing: set[str] = set()
        #: tool.run answers this error (code, message) instead.
        self.run_error: tuple[int, str] | None = None
        self._conns: list[FakeConn] = []
        self._subs: dict[str, FakeConn] = {}
        # Approvals and sessions (fsck).
        self.policy = "ask"
        self.assume_answerer = False  # ask even without an answerer subscribed
        self.approval_id = "a-1"  # the id the next request gets
        self.pending: dict[str, tuple[str, trio.Event]] = {}  # approvalId -> (callId, decided)
        self.decisions: dict[str, str] = {}  # approvalId -> outcome
        #: session.get answers by session id: a SessionInfo, or a FakeError to raise.
        self.infos: dict[str, Any] = {}
        #: session.events by session id (else ``events``).
        self.session_events: dict[str, list[dict]] = {}

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
        held = [sub_id for sub_id, owner in self._subs.items() if owner is conn]
        for sub_id in held:
            del self._subs[sub_id]
        if held and conn.capabilities.get("approvals"):
            self._answerers_left()

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
        conn.capabilities = dict(params.get("capabilities") or {})
        return {"protocolVersion": 1, "server": {"name": "fake-dshd", "version": "0"},
                "sandbox": {"provider": "bwrap", "completeness": "full"}}

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
        if conn.capabilities.get("approvals"):
            self._answerers_left()
        return {}

    def _answerers_left(self) -> None:
        """Like dshd: when the last answerer leaves, pending requests become unavailable."""
        if self.has_answerer():
            return
        for approval_id in self.pending:
            if approval_id not in self.decisions:
                self.decide_elsewhere(approval_id, "unavailable")

    async def _session_create(self, conn, params):
        if not os.path.isabs(params.get("cwd", "")):
            raise FakeError(-32602, "cwd must be absolute")
        return {"sessionId": "s1"}

    async def _session_list(self, conn, params):
        return {"sessions": self.sessions}

    async def _session_events(self, conn, params):
        events = self.session_events.get(params.get("sessionId"), self.events)
        after, limit = params.get("afterSeq", -1), params.get("limit", 1000)
        page = [e for e in events if e["seq"] > after][:limit]
        return {"events": page, "lastSeq": events[-1]["seq"] if events else -1}

    async def _session_get(self, conn, params):
        sid = params["sessionId"]
        info = self.infos.get(sid)
        if isinstance(info, FakeError):
            raise info
        if info is None:
            if sid == "missing":
                raise FakeError(-32004, f"session {sid} not found; `dsh sessions` lists the sessions")
            events = self.session_events.get(sid, self.events)
            info = {"sessionId": sid, "lastSeq": events[-1]["seq"] if events else -1}
        return info

    async def _set_policy(self, conn, params):
        if params.get("sessionId") == "missing":
            raise FakeError(-32004, "session missing not found; `dsh sessions` lists the sessions")
        if params.get("policy") not in ("ask", "never"):
            raise FakeError(-32602, "policy is ask or never")
        self.policy = params["policy"]
        return {}

    async def _approval_decide(self, conn, params):
        aid = params["approvalId"]
        if aid in self.decisions:
            raise FakeError(-32011, f"approval {aid} was already decided: {self.decisions[aid]}",
                            {"outcome": self.decisions[aid]})
        if aid not in self.pending:
            raise FakeError(-32007, f"approval {aid} not found in session {params['sessionId']}")
        outcome = "allowed-once" if params["decision"] == "allow" else "rejected"
        self.decide_elsewhere(aid, outcome)
        return {"outcome": outcome}

    def decide_elsewhere(self, approval_id: str, outcome: str, *, publish: bool = True) -> None:
        """Decide a pending request (as another answerer would). ``publish=False`` records it
        (a second decision gets -32011) but leaves the lane as it is until ``release``."""
        self.decisions[approval_id] = outcome
        self.events.append({"seq": len(self.events), "time": 0, "type": "approval/decided",
                            "data": {"approvalId": approval_id, "outcome": outcome,
                                     "by": "answerer"}})
        if publish:
            self.release(approval_id)

    def release(self, approval_id: str) -> None:
        self.pending[approval_id][1].set()

    def has_answerer(self) -> bool:
        return self.assume_answerer or any(c.capabilities.get("approvals")
                                           for c in self._subs.values())

    async def close_connections(self) -> None:
        """Hang up on every client (like a dshd that died)."""
        for conn in list(self._conns):
            await conn.stream.aclose()

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
        if self.run_error is not None:
            raise FakeError(*self.run_error)
        if call_id in self.existing:
            return {"callId": call_id, "existing": True}
        if params.get("approved"):
            self.play(call_id)
        else:
            self.call_id = call_id
            self._nursery.start_soon(self._ask, call_id, params["arguments"]["command"])
        return {"callId": call_id}

    def pending_ask(self, call_id: str, command: str) -> str:
        """A call already waiting for approval when clients come: it is in the base lane."""
        approval_id = self.approval_id
        self.call_id = call_id
        self.current_lane = lane(tools={call_id: tool_entry(command=command,
                                                            state="waiting-approval")})
        self.current_lane["approvals"] = {approval_id: self._request(call_id, command)}
        self.pending[approval_id] = (call_id, trio.Event())
        self._nursery.start_soon(self._await_decision, call_id, approval_id)
        return approval_id

    @staticmethod
    def _request(call_id: str, command: str) -> dict:
        return {"callId": call_id, "tool": "bash", "summary": command, "askedAt": 0}

    async def _ask(self, call_id: str, command: str) -> None:
        await self._publish([["s", ["tools", call_id], tool_entry(command=command,
                                                                  state="waiting-approval")]])
        if self.policy == "never":
            return await self._settle_unrun(call_id, "APPROVAL_REJECTED", "policy never: rejected.")
        if not self.has_answerer():
            return await self._settle_unrun(call_id, "APPROVAL_UNAVAILABLE",
                                            "nobody was attached to approve this call.")
        approval_id = self.approval_id
        self.pending[approval_id] = (call_id, trio.Event())
        await self._publish([["s", ["approvals", approval_id], self._request(call_id, command)]])
        await self._await_decision(call_id, approval_id)

    async def _await_decision(self, call_id: str, approval_id: str) -> None:
        await self.pending[approval_id][1].wait()
        outcome = self.decisions[approval_id]
        await self._publish([["d", ["approvals", approval_id]]])
        if outcome != "allowed-once":
            code = {"rejected": "APPROVAL_REJECTED", "cancelled": "APPROVAL_CANCELLED"}.get(
                outcome, "APPROVAL_UNAVAILABLE")
            return await self._settle_unrun(call_id, code, f"the call was {outcome}; it did not run.")
        await self._publish([["s", ["tools", call_id, "state"], "running"]])
        await self._play(call_id, announce=False)

    async def _settle_unrun(self, call_id: str, code: str, sentence: str) -> None:
        result = {"callId": call_id, "isError": True, "content": sentence, "details": {},
                  "errorCode": code}
        await self._publish([["p", ["recent"], 0, 0, [{
            "callId": call_id, "name": "bash", "isError": True, "exitCode": None,
            "errorCode": code}]], ["d", ["tools", call_id]]])
        self.final_result = result
        self.settled.set()

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
