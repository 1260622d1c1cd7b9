"""The bridge's HTTP door (docs/WEB.md): token -> cookie, 401 without it, Host checked
(DNS rebinding), no CORS ever; the WebSocket refused at the handshake without the cookie or
with a wrong, absent or other-port Origin. Real ``dsh web``, real HTTP (httpx), real
WebSocket (trio-websocket)."""

from __future__ import annotations

import httpx
import pytest
import trio
from trio_websocket import ConnectionRejected

from client.web.bridge import STATIC_DIR
from tests.web.bridge_support import LIVENESS_S, sign_in, ws_rpc

CORS = ("access-control-allow-origin", "access-control-allow-credentials",
        "access-control-allow-methods", "access-control-allow-headers")


def get(url: str, **kw) -> httpx.Response:
    return httpx.get(url, follow_redirects=False, timeout=LIVENESS_S, **kw)


def no_cors(r: httpx.Response) -> None:
    assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers


def test_no_token_and_wrong_token_are_401(bridge):
    for r in (get(bridge.base + "/"), get(bridge.base + "/static/app.js"),
              get(bridge.base + "/?token=wrong"), get(bridge.base + "/?token=" + bridge.token[:-1])):
        assert r.status_code == 401, (r.request.url, r.status_code)
        assert "Open the URL" in r.text or "wrong token" in r.text
        assert "set-cookie" not in r.headers
        no_cors(r)


def test_the_token_gives_a_strict_httponly_cookie_that_opens_the_page(bridge):
    r = get(bridge.url)
    assert r.status_code == 303 and r.headers["location"] == f"/#token={bridge.token}"
    cookie = r.headers.get_list("set-cookie")[0]  # then the sign-in marker
    parts = [p.strip() for p in cookie.split(";")]
    name, value = parts[0].split("=", 1)
    assert name == f"dsh-web-{bridge.port}"
    assert bridge.token not in cookie  # derived from the token, not the token
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(parts[1:]), cookie
    no_cors(r)
    page = get(bridge.base + "/", headers={"Cookie": parts[0]})
    index = STATIC_DIR / "index.html"
    # The page room ships index.html; until it is merged the bridge says it is missing.
    assert page.status_code == (200 if index.is_file() else 404), page
    assert page.headers["cache-control"] == "no-cache"
    if index.is_file():
        assert page.content == index.read_bytes()
    else:
        assert "not installed" in page.text
    no_cors(page)
    forged = get(bridge.base + "/", headers={"Cookie": f"{name}={value[:-1]}0"})
    assert forged.status_code == 401


def test_a_foreign_host_header_is_403(bridge):
    cookie = sign_in(bridge)
    for host in ("evil.example", f"evil.example:{bridge.port}", "127.0.0.2:1", "127.0.0.1:x",
                 f"localhost.evil.example:{bridge.port}", "[::2]:80"):
        r = get(bridge.base + "/", headers={"Host": host, "Cookie": cookie})
        assert r.status_code == 403, (host, r.status_code)
        no_cors(r)
        r = get(bridge.url, headers={"Host": host})
        assert r.status_code == 403 and "set-cookie" not in r.headers
    # a loopback name with any port: an SSH tunnel may forward another local port
    for host in (f"localhost:{bridge.port}", f"127.0.0.1:{bridge.port}", "127.0.0.1:9000",
                 "[::1]:9000", "LOCALHOST:1"):
        r = get(bridge.base + "/", headers={"Host": host, "Cookie": cookie})
        assert r.status_code not in (401, 403), (host, r.status_code)


def test_no_cors_even_on_a_preflight_from_an_evil_origin(bridge):
    cookie = sign_in(bridge)
    evil = {"Origin": "http://evil.example", "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "content-type"}
    for headers in (evil, {**evil, "Cookie": cookie}):
        r = httpx.request("OPTIONS", bridge.base + "/", headers=headers, timeout=LIVENESS_S)
        no_cors(r)
        assert r.status_code >= 400, r.status_code
    r = get(bridge.base + "/", headers={"Origin": "http://evil.example", "Cookie": cookie})
    no_cors(r)


async def _rejected(bridge, cookie: str, origin: str | None) -> int:
    with pytest.raises(ConnectionRejected) as info:
        async with ws_rpc(bridge, cookie, origin=origin):
            pass
    return info.value.status_code


@pytest.mark.trio
async def test_the_websocket_needs_the_cookie_and_its_own_origin(bridge):
    cookie = await trio.to_thread.run_sync(sign_in, bridge)
    assert await _rejected(bridge, "", "") == 403  # no cookie
    assert await _rejected(bridge, cookie.split("=")[0] + "=x", "") == 403  # wrong cookie
    for origin in (None, "http://evil.example", f"http://127.0.0.1:{bridge.port + 1}",
                   f"https://127.0.0.1:{bridge.port}", "null",
                   f"http://localhost:{bridge.port}"):  # not the Host this request named
        assert await _rejected(bridge, cookie, origin) == 403, origin
    async with ws_rpc(bridge, cookie) as rpc:
        init = await rpc.initialize()
        assert init["server"]["name"] == "dshd"
    assert "refused WebSocket /ws: wrong or absent Origin" in bridge.log
