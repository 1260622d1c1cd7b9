"""The bridge's ASGI app (docs/WEB.md): the guard, the page's files, and the ``/ws`` relay.

Theory of operation: :func:`build_app` returns a Starlette app wrapped in :class:`Guard`, a
plain ASGI layer that sees every request before any route does (auth.py has the rules):

* a ``Host`` that is not one of the bridge's own names -> 403 (DNS rebinding);
* ``GET ...?token=T``: the right token -> 303 to the same path without the query, with the
  cookie set (HttpOnly, SameSite=Strict, Path=/); a wrong one -> 401;
* no valid cookie -> 401 with a sentence telling to open the URL ``dsh web`` printed;
* ``?token=T`` redirects to the same path (only a path that cannot name another server: one
  leading ``/``, no backslash; else ``/``) with ``#token=T``: the page keeps the token in its
  origin's ``localStorage``. The 303 also sets a one-time sign-in marker, an HttpOnly cookie
  ``dsh-web-PORT-signin`` (a random nonce the guard remembers for :data:`SIGNIN_TTL_S`,
  ``Path=/signin``); the page stores a fragment's token only after ``POST /signin`` with the
  token in ``X-Dsh-Token`` answers ``204``: from the page's own origin, marker known and
  unspent, token right; only that answer spends the marker (a foreign page, on another port
  of the host, gets the cookies but cannot know the token: its POST is ``403`` and spends
  nothing). So a fragment a foreign page put in the address bar (``/#token=JUNK``) is never
  stored over the good token, and no page can keep the person from signing in;
* a WebSocket without the cookie, whose ``Origin`` is absent or not ``http://<Host>``, or that
  does not offer the subprotocols ``dsh.v1`` and ``dsh.token.<token>`` -> refused ``403`` at
  the handshake (the cookie reaches every port of the host, the page's storage does not);
  accepted ones answer ``dsh.v1``, never the token. Past ``max_clients`` relaying WebSockets a
  new one is accepted and closed ``1013`` ("too many pages open: close some").

No answer carries a CORS header; every HTTP answer (the handshake refusals too) carries
:data:`SECURITY_HEADERS` (CSP with ``frame-ancestors 'none'``, ``X-Frame-Options: DENY``,
``Referrer-Policy: no-referrer``, ``nosniff``, ``Cache-Control: no-cache``). An HTTP
answer's sends are shielded from cancellation (:func:`_secured`): hypercorn closes the
connection, or starts its keep-alive timer, inside the last one. Logs name the
path, never the query string nor the subprotocols (the token travels there).

The relay (:func:`relay`): after the WebSocket is accepted the bridge opens ONE connection to
dshd's Unix socket and runs two tasks in a nursery. ws->dshd: each text message becomes one
line, then ``\\n``. A message without raw ``\\r``/``\\n`` goes as it is, unparsed (the fast
path). One holding them is checked first (msgspec, without building objects): valid JSON has
them only as insignificant whitespace, so they are replaced by spaces; invalid JSON (a raw
break inside a string, where the replacement would make valid JSON of another command) is
answered by the bridge itself, ``-32700`` with ``id`` null, and nothing is sent to dshd.
U+2028/U+2029 are not special: dshd's framing splits on ``\\n`` alone.
dshd->ws: the socket is read into a ``protocol.framing.LineBuffer`` bounded at
:data:`MAX_MESSAGE_BYTES`; each line is one text message, sent (awaited) before more is read, so
a slow browser slows the reading of dshd (back-pressure; the buffer never holds more than one
line and one chunk). Either side ending ends the other: dshd unreachable at connect -> close
``4001`` ("dshd is not running"); dshd closed -> ``4000`` ("dshd closed the connection"); a line
from dshd over the bound -> ``1009``; the browser closing -> the dshd connection is closed; the bridge stopping (SIGTERM/SIGINT) ->
``1001`` ("dsh web is stopping").
A message from the browser over the bound is refused by the server (hypercorn's
``websocket_max_message_size``: close ``1009``); hypercorn then tells the app ``1006``, as
for a browser that closed or left, so the log names both. A binary message -> close ``1003``.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

import msgspec
import trio
from starlette.applications import Starlette
from starlette.datastructures import Headers, QueryParams
from starlette.requests import cookie_parser
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from client.web.auth import SUBPROTOCOL, AuthRules
from protocol.framing import NEED_DATA, LineBuffer, Oversize
from protocol.rpc import PARSE_ERROR, encode_error

__all__ = ["CLOSE_DSHD_CLOSED", "CLOSE_DSHD_UNREACHABLE", "MAX_CLIENTS", "MAX_MESSAGE_BYTES",
           "SECURITY_HEADERS", "SIGNIN_TTL_S", "STATIC_DIR",
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
CLOSE_TRY_LATER = 1013
#: The most WebSockets relaying at once (``--max-clients``): each holds a dshd connection,
#: and dshd has 256 for every client of the user.
MAX_CLIENTS = 64
STATIC_DIR = Path(__file__).resolve().parent / "static"
_READ_CHUNK = 64 * 1024
#: How long a token exchange's sign-in marker may be spent by the page's ``POST /signin``.
SIGNIN_TTL_S = 60.0
_MAX_MARKERS = 16  # unspent sign-in markers remembered (the oldest is forgotten first)

_NEED_URL = ("dsh web: not signed in. Open the URL that `dsh web` printed "
             "(http://127.0.0.1:PORT/?token=...); it sets the cookie this page needs.\n")
_BAD_TOKEN = "dsh web: wrong token. Open the URL that `dsh web` printed last.\n"
_BAD_HOST = "dsh web: this Host is not the bridge's address (DNS rebinding is refused).\n"
_NOT_EXCHANGED = ("dsh web: this token did not come from this bridge's sign-in (or it was "
                  "already used); the page keeps the token it had.\n")
_NO_PAGE = "dsh web: the page is not installed (client/web/static/index.html is missing).\n"


#: Sent with every HTTP answer (the WebSocket's handshake refusals included).
SECURITY_HEADERS = (
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; "
     b"connect-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-cache"),
)
_OURS = frozenset(name for name, _ in SECURITY_HEADERS)


class Guard:
    """The ASGI layer in front of every route: Host, token, cookie, Origin (module doc)."""

    def __init__(self, app: ASGIApp, rules: AuthRules,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.app = app
        self.rules = rules
        self.clock = clock
        self.markers: dict[str, float] = {}  # unspent sign-in marker -> its deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        host = headers.get("host")
        signed_in = self.rules.cookie_ok(cookie_parser(headers.get("cookie", "")))
        path = scope.get("path", "")
        send = _secured(send, http=kind == "http")
        if kind == "websocket":
            why = self._ws_refusal(scope, headers, host, signed_in)
            if why:
                return await _refuse_ws(scope, receive, send, path, why)
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
        if path == "/signin" and scope.get("method") == "POST":
            return await self._signin(headers, scope, receive, send)
        await self.app(scope, receive, send)

    @property
    def marker_name(self) -> str:
        return f"{self.rules.cookie_name}-signin"

    async def _signin(self, headers: Headers, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /signin``: 204 when it comes from the page's own origin (``Origin`` is
        ``http://<Host>``: a page on another port of the host gets the cookies, not this), the
        marker cookie is one this guard handed out, unspent and in time, and ``X-Dsh-Token``
        is the token; else 403. Only a right answer spends the marker: a foreign page's POST,
        which cannot know the token, cannot spend it to keep the person from signing in."""
        marker = cookie_parser(headers.get("cookie", "")).get(self.marker_name, "")
        deadline = self.markers.get(marker)
        fresh = deadline is not None and self.clock() <= deadline
        ok = (fresh and self.rules.origin_ok(headers.get("origin"), headers.get("host"))
              and self.rules.token_ok(headers.get("x-dsh-token", "")))
        log.info("sign-in check: %s", "accepted" if ok else "refused")
        if not ok:
            if deadline is not None and not fresh:
                del self.markers[marker]  # out of time: gone
            await _plain(_NOT_EXCHANGED, 403)(scope, receive, send)
            return
        del self.markers[marker]
        response = Response(status_code=204)
        response.set_cookie(self.marker_name, "", max_age=0, path="/signin", httponly=True,
                            samesite="strict")
        await response(scope, receive, send)

    def _ws_refusal(self, scope: Scope, headers: Headers, host: str | None,
                    signed_in: bool) -> str:
        """Why this WebSocket is refused ("" to accept). Never names the token."""
        if not self.rules.host_ok(host):
            return "foreign Host"
        if not signed_in:
            return "no valid cookie"
        if not self.rules.origin_ok(headers.get("origin"), host):
            return "wrong or absent Origin"
        if not self.rules.subprotocol_ok(list(scope.get("subprotocols") or [])):
            return "no valid token subprotocol"
        return ""

    async def _exchange(self, token: str, scope: Scope, receive: Receive, send: Send) -> None:
        """``?token=``: the cookie and a 303 to the same path with the token in the fragment
        (for the page's localStorage; a fragment never reaches a server), or 401."""
        path = scope.get("path", "/")
        if not self.rules.token_ok(token):
            log.info("refused %s %s: wrong token", scope.get("method"), path)
            return await _plain(_BAD_TOKEN, 401)(scope, receive, send)
        cookie = (f"{self.rules.cookie_name}={self.rules.cookie_value}; HttpOnly; "
                  "SameSite=Strict; Path=/")
        marker = secrets.token_urlsafe(16)
        while len(self.markers) >= _MAX_MARKERS:
            self.markers.pop(next(iter(self.markers)))
        self.markers[marker] = self.clock() + SIGNIN_TTL_S
        response = Response(status_code=303, headers={
            "Location": f"{_local_path(scope)}#token={self.rules.token}", "Set-Cookie": cookie})
        response.set_cookie(self.marker_name, marker, max_age=int(SIGNIN_TTL_S), path="/signin",
                            httponly=True, samesite="strict")
        log.info("signed in: %s", path)
        await response(scope, receive, send)


def _local_path(scope: Scope) -> str:
    """The request's path for a redirect, if it can only mean this server: one leading ``/``
    and no backslash (``//host`` and ``/\\host`` are another server to a browser); else ``/``."""
    path = scope.get("path", "")
    raw = scope.get("raw_path")
    raw = raw.decode("latin-1") if isinstance(raw, bytes) else quote(path)
    for p in (path, raw):
        if not p.startswith("/") or p.startswith("//") or "\\" in p or not p.isprintable():
            return "/"
    return raw


async def _refuse_ws(scope: Scope, receive: Receive, send: Send, path: str, why: str) -> None:
    """Refuse before accepting: a plain 403 answer to the handshake (with the headers of
    every HTTP answer) where the server supports it, else a close the server answers 403."""
    log.info("refused WebSocket %s: %s", path, why)
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        body = b"dsh web: refused; open the URL that `dsh web` printed.\n"
        await send({"type": "websocket.http.response.start", "status": 403, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008})


def _plain(text: str, status: int) -> Response:
    return PlainTextResponse(text, status_code=status)


def _secured(send: Send, http: bool = False) -> Send:
    """Every HTTP answer (and handshake refusal) gets SECURITY_HEADERS, replacing its own.

    An HTTP answer's sends are shielded: hypercorn ends the response's connection inside the
    app's last send (closing it after ``Connection: close``, else starting its keep-alive
    timer), and Starlette's FileResponse cancels that very send once it sees the
    ``http.disconnect`` hypercorn queues there; cut short, the socket of a page file stayed
    open until the client left. hypercorn shields its own socket writes, so this blocks no
    longer than they do."""
    async def sender(message: Message) -> None:
        if message["type"] in ("http.response.start", "websocket.http.response.start"):
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _OURS]
            message = {**message, "headers": [*headers, *SECURITY_HEADERS]}
        if http:
            with trio.CancelScope(shield=True):
                await send(message)
        else:
            await send(message)
    return sender


def build_app(rules: AuthRules, dshd_socket: Path, stopping: trio.Event,
              static_dir: Path = STATIC_DIR, max_clients: int = MAX_CLIENTS) -> Guard:
    """The whole bridge app for one listening port and one dshd socket; when ``stopping`` is
    set every open relay closes ``1001``; past ``max_clients`` open WebSockets a new one is
    closed ``1013`` (each holds one of dshd's connections)."""
    open_now = [0]  # WebSockets relaying now (this app's only state)

    async def index(request: Any) -> Response:
        page = static_dir / "index.html"
        if not page.is_file():
            return _plain(_NO_PAGE, 404)
        return FileResponse(page, media_type="text/html")

    async def ws(websocket: WebSocket) -> None:
        if open_now[0] >= max_clients:
            await websocket.accept(subprotocol=SUBPROTOCOL)
            await _close(websocket, CLOSE_TRY_LATER, "too many pages open: close some")
            return
        open_now[0] += 1
        try:
            await relay(websocket, dshd_socket, stopping)
        finally:
            open_now[0] -= 1

    app = Starlette(routes=[
        Route("/", index, methods=["GET", "HEAD"]),
        Mount("/static", app=StaticFiles(directory=static_dir, check_dir=False)),
        WebSocketRoute("/ws", ws),
    ])
    return Guard(app, rules)


async def relay(websocket: WebSocket, dshd_socket: Path, stopping: trio.Event) -> None:
    """One WebSocket <-> one dshd connection, raw lines both ways (module doc)."""
    await websocket.accept(subprotocol=SUBPROTOCOL)
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
                code = message.get("code")
                if code == 1006:  # hypercorn's code for every close the bridge did not make
                    log.info("WebSocket ended from the browser's side: it closed or left, or "
                             "hypercorn closed it 1009 for a message over 16 MiB (hypercorn "
                             "reports both as 1006)")
                else:
                    log.info("WebSocket closed by the browser (%s)", code)
                return
            text = message.get("text")
            if text is None:
                await websocket.close(CLOSE_UNSUPPORTED, "text messages only")
                return
            line = text.encode("utf-8", "surrogatepass")
            if b"\n" in line or b"\r" in line:
                refusal = _raw_break_refusal(line)
                if refusal is not None:
                    await websocket.send_text(refusal)
                    continue
                line = line.replace(b"\r", b" ").replace(b"\n", b" ")
            await stream.send_all(line + b"\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        await _close(websocket, CLOSE_DSHD_CLOSED, "dshd closed the connection")
    finally:
        scope.cancel()


def _raw_break_refusal(line: bytes) -> str | None:
    """A message holding raw CR/LF: None when it is valid JSON (its raw line breaks were
    insignificant whitespace, so spaces may replace them), else the ``-32700`` answer the
    bridge gives itself (``id`` null; nothing goes to dshd). A raw break inside a string is
    invalid JSON, which the replacement would have turned into valid JSON of another command."""
    try:
        msgspec.json.decode(line, type=msgspec.Raw)  # validates without building objects
        return None
    except msgspec.DecodeError as exc:
        why = str(exc)
    except RecursionError:
        why = "JSON nested too deeply"
    log.info("refused a message with raw line breaks: not valid JSON (%s)", why)
    return encode_error(None, PARSE_ERROR, (
        f"parse error: {why}; a message holding raw line breaks is relayed only when it is "
        "valid JSON (a line break inside a string must be the escape \\n): nothing was sent "
        "to dshd")).decode().rstrip("\n")


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
