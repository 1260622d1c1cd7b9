"""Helpers of the bridge tests: the signed-in cookie and a JSON-RPC client over a real
WebSocket (trio-websocket) through a real ``dsh web``."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import httpx
import trio
from trio_websocket import open_websocket_url

LIVENESS_S = 15.0  # a generous "it happens" bound, never a speed target


def sign_in(bridge) -> str:
    """GET the tokened URL; the ``name=value`` of the cookie it sets."""
    r = httpx.get(bridge.url, follow_redirects=False, timeout=LIVENESS_S)
    assert r.status_code == 303, r
    return r.headers["set-cookie"].split(";", 1)[0]


def token_protocols(token: str) -> list[str]:
    """The WebSocket subprotocols the page offers: ``dsh.v1`` and its token (docs/WEB.md)."""
    return ["dsh.v1", f"dsh.token.{token}"]


def ws_url(bridge) -> str:
    return bridge.base.replace("http://", "ws://", 1) + "/ws"


class WsRpc:
    """JSON-RPC over one WebSocket: ``call`` waits for its answer; notifications are kept."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.notes: list[dict] = []
        self._next_id = 0

    async def send_raw(self, text: str) -> None:
        await self.ws.send_message(text)

    async def receive(self) -> dict:
        with trio.fail_after(LIVENESS_S):
            return json.loads(await self.ws.get_message())

    async def answer(self, rid) -> dict:
        while True:
            msg = await self.receive()
            if "id" in msg and msg.get("id") == rid and "method" not in msg:
                return msg
            self.notes.append(msg)

    async def call(self, method: str, params: dict | None = None) -> dict:
        """The whole answer (``result`` or ``error``)."""
        self._next_id += 1
        await self.send_raw(json.dumps({"jsonrpc": "2.0", "id": self._next_id,
                                        "method": method, "params": params or {}}))
        return await self.answer(self._next_id)

    async def result(self, method: str, params: dict | None = None) -> dict:
        msg = await self.call(method, params)
        assert "result" in msg, msg
        return msg["result"]

    async def notification(self, predicate) -> dict:
        """The first kept or arriving notification for which ``predicate`` holds."""
        for i, note in enumerate(self.notes):
            if predicate(note):
                return self.notes.pop(i)
        while True:
            msg = await self.receive()
            if predicate(msg):
                return msg
            self.notes.append(msg)

    async def initialize(self) -> dict:
        return await self.result("initialize", {"protocolVersion": 1,
                                                "client": {"name": "dsh-web-test"}})


@asynccontextmanager
async def ws_rpc(bridge, cookie: str, *, origin: str | None = "", host: str | None = None,
                 max_message_size: int = 32 * 1024 * 1024, subprotocols: list[str] | None = None):
    """An open :class:`WsRpc`; ``origin=""`` means the bridge's own (``bridge.base``);
    ``subprotocols`` None offers the bridge's token (:func:`token_protocols`)."""
    headers = []
    if cookie:
        headers.append(("Cookie", cookie))
    if origin is not None:
        headers.append(("Origin", origin or bridge.base))
    async with open_websocket_url(ws_url(bridge), extra_headers=headers,
                                  max_message_size=max_message_size,
                                  subprotocols=(token_protocols(bridge.token)
                                                if subprotocols is None else subprotocols),
                                  connect_timeout=LIVENESS_S,
                                  disconnect_timeout=LIVENESS_S) as ws:
        yield WsRpc(ws)
