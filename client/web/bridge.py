"""The bridge's ASGI app (docs/WEB.md): the guard, the page's files, and the ``/ws`` relay.

Theory of operation: :func:`build_app` returns a Starlette app wrapped in :class:`Guard`, a
plain ASGI layer that sees every request before any route does (auth.py has the rules):

* a ``Host`` that is not one of the bridge's own names -> 403 (DNS rebinding);
* ``GET ...?token=T``: the right token -> 303 to the same path without the query, with the
  cookie set (HttpOnly, SameSite=Strict, Path=/); a wrong one -> 401;
* no valid cookie -> 401 with a sentence telling to open the URL ``dsh web`` printed;
* a WebSocket without the cookie, or whose ``Origin`` is absent or not ``http://<Host>`` ->
  closed before it is accepted, which the server answers ``403`` at the handshake.

No answer carries a CORS header; every HTTP answer says ``Cache-Control: no-cache``. Logs name
the path, never the query string (the token travels there).

The relay (:func:`relay`): after the WebSocket is accepted the bridge opens ONE connection to
dshd's Unix socket and runs two tasks in a nursery. ws->dshd: each text message becomes one
line (raw ``\\r``/``\\n`` replaced by spaces: inside JSON they can only be insignificant
whitespace; a newline inside a JSON string is already the escape ``\\n``), then ``\\n``.
dshd->ws: the socket is read into a ``protocol.framing.LineBuffer`` bounded at
:data:`MAX_MESSAGE_BYTES`; each line is one text message, sent (awaited) before more is read, so
a slow browser slows the reading of dshd (back-pressure; the buffer never holds more than one
line and one chunk). Either side ending ends the other: dshd unreachable at connect -> close
``4001`` ("dshd is not running"); dshd closed -> ``4000`` ("dshd closed the connection"); a line
from dshd over the bound -> ``1009``; the browser closing -> the dshd connection is closed; the bridge stopping (SIGTERM/SIGINT) ->
``1001`` ("dsh web is stopping").
A message from the browser over the bound is refused by the server (hypercorn's
``websocket_max_message_size``: close ``1009``). A binary message -> close ``1003``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.datastructures import Headers, QueryParams
from starlette.requests import cookie_parser
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from client.web.auth import AuthRules
from protocol.framing import NEED_DATA, LineBuffer, Oversize

__all__ = ["CLOSE_DSHD_CLOSED", "CLOSE_DSHD_UNREACHABLE", "MAX_MESSAGE_BYTES", "STATIC_DIR",
           "Guard", "build_app", "relay"]

log = logging.getLogger("dsh.web")

#: The largest WebSocket message either way, and the largest dshd line relayed (16 MiB).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: dshd could not be reached when the WebSocket opened.
CLOSE_DSHD_UNREACHABLE = 4001
#: dshd closed its connection (stopped, restarted, or ended this client).
CLOSE_DSHD_CLOSED = 4000
CLOSE_GOING_AWAY = 1001
CLOSE_TOO_BIG = 1009
CLOSE_UNSUPPORTED = 1003
STATIC_DIR = Path(__file__).resolve().parent / "static"
_READ_CHUNK = 64 * 1024

_NEED_URL = ("dsh web: not signed in. Open the URL that `dsh web` printed "
             "(http://127.0.0.1:PORT/?token=...); it sets the cookie this page needs.\n")
_BAD_TOKEN = "dsh web: wrong token. Open the URL that `dsh web` printed last.\n"
_BAD_HOST = "dsh web: this Host is not the bridge's address (DNS rebinding is refused).\n"
_NO_PAGE = "dsh web: the page is not installed (client/web/static/index.html is missing).\n"


class Guard:
    """The ASGI layer in front of every route: Host, token, cookie, Origin (module doc)."""

    def __init__(self, app: ASGIApp, rules: AuthRules) -> None:
        self.app = app
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        host = headers.get("host")
        cookies = cookie_parser(headers.get("cookie", ""))
        signed_in = self.rules.cookie_ok(cookies)
        path = scope.get("path", "")
        if kind == "websocket":
            if not self.rules.host_ok(host):
                return await self._refuse_ws(receive, send, path, "foreign Host")
            if not signed_in:
                return await self._refuse_ws(receive, send, path, "no valid cookie")
            if not self.rules.origin_ok(headers.get("origin"), host):
                return await self._refuse_ws(receive, send, path, "wrong or absent Origin")
            return await self.app(scope, receive, send)
        if not self.rules.host_ok(host):
            log.info("refused %s %s: foreign Host", scope.get("method"), path)
            return await _plain(_BAD_HOST, 403)(scope, receive, send)
        query = QueryParams(scope.get("query_string", b""))
        if "token" in query:
            return await self._exchange(query["token"], scope, receive, send)
        if not signed_in:
            log.info("refused %s %s: not signed in", scope.get("method"), path)
            return await _plain(_NEED_URL, 401)(scope, receive, send)
        await self.app(scope, receive, _no_cache(send))

    async def _exchange(self, token: str, scope: Scope, receive: Receive, send: Send) -> None:
        """``?token=``: the cookie and a redirect to the same path, or 401."""
        path = scope.get("path", "/")
        if not self.rules.token_ok(token):
            log.info("refused %s %s: wrong token", scope.get("method"), path)
            return await _plain(_BAD_TOKEN, 401)(scope, receive, send)
        cookie = (f"{self.rules.cookie_name}={self.rules.cookie_value}; HttpOnly; "
                  "SameSite=Strict; Path=/")
        response = Response(status_code=303, headers={
            "Location": path if path.startswith("/") else "/", "Set-Cookie": cookie,
            "Cache-Control": "no-cache"})
        log.info("signed in: %s", path)
        await response(scope, receive, send)

    @staticmethod
    async def _refuse_ws(receive: Receive, send: Send, path: str, why: str) -> None:
        """Close before accepting: the server answers the handshake 403."""
        log.info("refused WebSocket %s: %s", path, why)
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008})


def _plain(text: str, status: int) -> Response:
    return PlainTextResponse(text, status_code=status, headers={"Cache-Control": "no-cache"})


def _no_cache(send: Send) -> Send:
    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"cache-control"]
            message = {**message, "headers": [*headers, (b"cache-control", b"no-cache")]}
        await send(message)
    return sender


def build_app(rules: AuthRules, dshd_socket: Path, stopping: trio.Event,
              static_dir: Path = STATIC_DIR) -> Guard:
    """The whole bridge app for one listening port and one dshd socket; when ``stopping`` is
    set every open relay closes ``1001``."""

    async def index(request: Any) -> Response:
        page = static_dir / "index.html"
        if not page.is_file():
            return _plain(_NO_PAGE, 404)
        return FileResponse(page, media_type="text/html")

    async def ws(websocket: WebSocket) -> None:
        await relay(websocket, dshd_socket, stopping)

    app = Starlette(routes=[
        Route("/", index, methods=["GET", "HEAD"]),
        Mount("/static", app=StaticFiles(directory=static_dir, check_dir=False)),
        WebSocketRoute("/ws", ws),
    ])
    return Guard(app, rules)


async def relay(websocket: WebSocket, dshd_socket: Path, stopping: trio.Event) -> None:
    """One WebSocket <-> one dshd connection, raw lines both ways (module doc)."""
    await websocket.accept()
    try:
        stream = await trio.open_unix_socket(str(dshd_socket))
    except OSError as exc:
        log.info("WebSocket closed %d: dshd is not running (%s)", CLOSE_DSHD_UNREACHABLE,
                 exc.strerror or exc)
        await websocket.close(CLOSE_DSHD_UNREACHABLE, "dshd is not running")
        return
    log.info("WebSocket open, relaying to dshd")
    async with stream:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_to_dshd, websocket, stream, nursery.cancel_scope)
            nursery.start_soon(_from_dshd, websocket, stream, nursery.cancel_scope)
            nursery.start_soon(_at_stop, websocket, stopping, nursery.cancel_scope)


async def _at_stop(websocket: WebSocket, stopping: trio.Event, scope: trio.CancelScope) -> None:
    """The bridge is stopping: close ``1001`` (going away) rather than drop the connection."""
    await stopping.wait()
    await _close(websocket, CLOSE_GOING_AWAY, "dsh web is stopping")
    scope.cancel()


async def _to_dshd(websocket: WebSocket, stream: trio.SocketStream,
                   scope: trio.CancelScope) -> None:
    """Browser -> dshd: one text message, one line; a disconnect ends the relay."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                log.info("WebSocket closed by the browser (%s)", message.get("code"))
                return
            text = message.get("text")
            if text is None:
                await websocket.close(CLOSE_UNSUPPORTED, "text messages only")
                return
            line = text.replace("\r", " ").replace("\n", " ").encode("utf-8", "surrogatepass")
            await stream.send_all(line + b"\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        await _close(websocket, CLOSE_DSHD_CLOSED, "dshd closed the connection")
    finally:
        scope.cancel()


async def _from_dshd(websocket: WebSocket, stream: trio.SocketStream,
                     scope: trio.CancelScope) -> None:
    """dshd -> browser: each line one text message, sent before more is read."""
    lines = LineBuffer(MAX_MESSAGE_BYTES)
    try:
        while True:
            event = lines.next_event()
            if event is NEED_DATA:
                try:
                    chunk = await stream.receive_some(_READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    chunk = b""
                if not chunk:
                    await _close(websocket, CLOSE_DSHD_CLOSED, "dshd closed the connection")
                    return
                lines.feed(chunk)
            elif isinstance(event, Oversize):
                await _close(websocket, CLOSE_TOO_BIG, "a message from dshd is over 16 MiB")
                return
            else:
                await websocket.send_text(bytes(event).decode("utf-8", "replace"))
    except (WebSocketDisconnect, RuntimeError):
        return  # the browser is gone; _to_dshd sees its disconnect or is cancelled
    finally:
        lines.close()
        scope.cancel()


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    log.info("WebSocket closed %d: %s", code, reason)
    try:
        await websocket.close(code, reason)
    except (RuntimeError, WebSocketDisconnect):
        pass  # already closed by the other side
