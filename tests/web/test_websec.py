"""Findings of outside testers against the bridge (docs/WEB.md "Security model"), each pinned:
a stolen cookie is not enough for the WebSocket (the token subprotocol is needed too), the
browser's security headers on every HTTP answer, the token exchange's redirect stays on the
bridge, a bound on open WebSockets, a loopback Host with any port (an SSH tunnel's), and a
port in use says what to do. Real ``dsh web``, real HTTP, real WebSockets, a real TCP forward.
"""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from tests.web.bridge_support import LIVENESS_S, sign_in, token_protocols, ws_rpc, ws_url

SECURITY_HEADERS = {
    "content-security-policy": ("default-src 'self'; frame-ancestors 'none'; connect-src 'self'; "
                                "img-src 'self' data:; style-src 'self' 'unsafe-inline'"),
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
}


def raw_get(port: int, target: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """One HTTP/1.1 GET with ``target`` sent verbatim (no client normalises it)."""
    lines = [f"GET {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items()),
             *([] if "Connection" in headers else ["Connection: close"]), "", ""]
    with socket.create_connection(("127.0.0.1", port), timeout=LIVENESS_S) as s:
        s.sendall("\r\n".join(lines).encode("latin-1"))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    return status, {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}


async def _status(bridge, cookie: str, protocols, *, origin: str = "") -> int | str:
    """The handshake's refusal status, or ``"open:<subprotocol>"`` once accepted."""
    try:
        async with ws_rpc(bridge, cookie, origin=origin, subprotocols=protocols) as rpc:
            await rpc.initialize()
            return f"open:{rpc.ws.subprotocol}"
    except ConnectionRejected as exc:
        return exc.status_code


# --- F1: the cookie alone does not open the WebSocket ---------------------------------------

def test_the_token_exchange_hands_the_token_to_the_page_in_the_fragment(bridge):
    r = httpx.get(bridge.url, follow_redirects=False, timeout=LIVENESS_S)
    assert r.status_code == 303
    assert r.headers["location"] == f"/#token={bridge.token}", r.headers["location"]


def _exchange_cookies(bridge) -> tuple[str, str]:
    """The token exchange's two cookies as ``name=value``: the sign-in and its one-time marker."""
    r = httpx.get(bridge.url, follow_redirects=False, timeout=LIVENESS_S)
    assert r.status_code == 303, r
    found = {c.split("=", 1)[0]: c.split(";", 1)[0] for c in r.headers.get_list("set-cookie")}
    marker = found[f"dsh-web-{bridge.port}-signin"]
    assert "HttpOnly" in r.headers.get_list("set-cookie")[1]
    return found[f"dsh-web-{bridge.port}"], marker


def _signin_check(bridge, cookies: str, token: str | None, origin: str | None = "") -> int:
    headers = {"Cookie": cookies}
    if token is not None:
        headers["X-Dsh-Token"] = token
    if origin is not None:
        headers["Origin"] = origin or bridge.base  # "": the page's own origin
    r = httpx.post(bridge.base + "/signin", headers=headers, timeout=LIVENESS_S)
    return r.status_code


def test_a_fragment_token_counts_only_right_after_the_token_exchange(bridge):
    """An attacker's page sends the browser to /#token=JUNK: the page asks POST /signin before
    storing a fragment's token, and only the exchange's one-time marker with the right token,
    from the page's own origin, is accepted; a fragment alone (no marker), a wrong token, a
    foreign origin or a spent marker is refused."""
    cookie, marker = _exchange_cookies(bridge)
    both = f"{cookie}; {marker}"
    assert _signin_check(bridge, cookie, bridge.token) == 403  # no marker: not an exchange
    assert _signin_check(bridge, both, "A" * len(bridge.token)) == 403  # wrong token
    assert _signin_check(bridge, both, bridge.token, origin=None) == 403  # no Origin
    assert _signin_check(bridge, both, bridge.token) == 204  # right: the marker is spent now
    assert _signin_check(bridge, both, bridge.token) == 403  # one time only
    assert bridge.token not in bridge.log


def test_a_page_on_another_port_cannot_spend_the_sign_in_marker(bridge):
    """The cookies reach every port of the host: an attacker's page on another 127.0.0.1
    port POSTing /signin (no token: it cannot read it) used to spend the marker, and the
    person's own page was then refused ("signed out"). Now it spends nothing."""
    cookie, marker = _exchange_cookies(bridge)
    both = f"{cookie}; {marker}"
    foreign = "http://127.0.0.1:18999"
    for _ in range(5):
        assert _signin_check(bridge, both, None, origin=foreign) == 403
        assert _signin_check(bridge, both, "", origin=foreign) == 403
        assert _signin_check(bridge, both, bridge.token, origin=foreign) == 403
        assert _signin_check(bridge, both, None) == 403
    assert _signin_check(bridge, both, bridge.token) == 204  # the person's page signs in


@pytest.mark.trio
async def test_a_stolen_cookie_with_a_forged_origin_is_refused_without_the_token(bridge):
    cookie = await trio.to_thread.run_sync(sign_in, bridge)
    wrong = "A" * len(bridge.token)
    for protocols in ([], ["dsh.v1"], ["dsh.v1", f"dsh.token.{wrong}"],
                      ["dsh.v1", f"dsh.token.{bridge.token[:-1]}"], [f"dsh.token.{bridge.token}x"]):
        assert await _status(bridge, cookie, protocols) == 403, protocols
    # the token without the cookie is refused too: both are needed
    assert await _status(bridge, "", token_protocols(bridge.token)) == 403
    assert await _status(bridge, cookie, token_protocols(bridge.token)) == "open:dsh.v1"
    assert bridge.token not in bridge.log
    assert "dsh.token" not in bridge.log


# --- F3: the browser's security headers ------------------------------------------------------

def test_every_http_answer_carries_the_security_headers(bridge):
    cookie = sign_in(bridge)
    answers = [
        httpx.get(bridge.base + "/", timeout=LIVENESS_S),  # 401
        httpx.get(bridge.base + "/", headers={"Host": "evil.example"}, timeout=LIVENESS_S),  # 403
        httpx.get(bridge.url, timeout=LIVENESS_S),  # 303
        httpx.get(bridge.base + "/", headers={"Cookie": cookie}, timeout=LIVENESS_S),  # the page
        httpx.get(bridge.base + "/static/app.js", headers={"Cookie": cookie}, timeout=LIVENESS_S),
        httpx.get(bridge.base + "/static/nope.js", headers={"Cookie": cookie}, timeout=LIVENESS_S),
        httpx.get(bridge.base + "/ws", headers={"Cookie": cookie}, timeout=LIVENESS_S),  # no upgrade
    ]
    assert [r.status_code for r in answers] == [401, 403, 303, 200, 200, 404, 404], answers
    for r in answers:
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, (r.request.url, r.status_code, name, r.headers)
        assert r.headers.get("cache-control") == "no-cache", (r.request.url, r.headers)


# --- F5: no open redirect --------------------------------------------------------------------

def test_the_token_exchange_redirects_only_to_a_path_of_the_bridge(bridge):
    host = {"Host": f"127.0.0.1:{bridge.port}"}
    for target, expected in ((f"//evil.example/?token={bridge.token}", "/"),
                             (f"/\\evil.example?token={bridge.token}", "/"),
                             (f"///evil.example?token={bridge.token}", "/"),
                             (f"/static/app.js?token={bridge.token}", "/static/app.js")):
        status, headers = raw_get(bridge.port, target, host)
        assert status == 303, (target, status)
        assert headers["location"] == f"{expected}#token={bridge.token}", (target, headers)


# --- F7: a bound on open WebSockets ----------------------------------------------------------

@pytest.fixture
def small_bridge(web_daemon, tmp_path):
    from tests.web.conftest import WebBridge

    b = WebBridge(web_daemon.socket, tmp_path / "tok" / "web-token", extra_args=("--max-clients", "3"))
    try:
        b.start()
        yield b
    finally:
        b.close()


@pytest.mark.trio
async def test_past_max_clients_a_websocket_is_closed_1013_and_the_others_keep_working(small_bridge):
    bridge = small_bridge
    cookie = await trio.to_thread.run_sync(sign_in, bridge)
    async with ws_rpc(bridge, cookie) as a, ws_rpc(bridge, cookie) as b, ws_rpc(bridge, cookie) as c:
        for rpc in (a, b, c):
            await rpc.initialize()
        async with ws_rpc(bridge, cookie) as extra:
            with pytest.raises(ConnectionClosed) as closed:
                with trio.fail_after(LIVENESS_S):
                    await extra.ws.get_message()
            assert closed.value.reason.code == 1013, closed.value.reason
            assert "too many pages open" in closed.value.reason.reason
        assert "result" in await a.call("session.list")
    # closed ones free their places
    async with ws_rpc(bridge, cookie) as again:
        await again.initialize()


def test_max_clients_defaults_to_64_and_is_in_the_help(web_daemon):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "client.cli", "web", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert "--max-clients" in r.stdout and "64" in r.stdout, r.stdout
    assert "/tmp/dsh-$UID/web-token" in r.stdout, r.stdout


# --- docs finding 1: an SSH tunnel on another local port ------------------------------------

@asynccontextmanager
async def tcp_forward(target_port: int):
    """A TCP forward 127.0.0.1:<free port> -> 127.0.0.1:target_port (like ``ssh -L``)."""

    async def pipe(src, dst):
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.move_on_after(1):
                await dst.aclose()

    async def handle(client):
        server = await trio.open_tcp_stream("127.0.0.1", target_port)
        async with trio.open_nursery() as n:
            n.start_soon(pipe, client, server)
            n.start_soon(pipe, server, client)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_tunnel_on_another_local_port_works_and_another_origin_is_still_refused(bridge):
    async with tcp_forward(bridge.port) as port:
        base = f"http://127.0.0.1:{port}"
        r = await trio.to_thread.run_sync(lambda: httpx.get(
            f"{base}/?token={bridge.token}", follow_redirects=False, timeout=LIVENESS_S))
        assert r.status_code == 303, r
        cookie = r.headers["set-cookie"].split(";", 1)[0]
        url = f"ws://127.0.0.1:{port}/ws"

        async def attempt(origin: str):
            headers = [("Cookie", cookie), ("Origin", origin)]
            try:
                async with open_websocket_url(url, extra_headers=headers,
                                              subprotocols=token_protocols(bridge.token),
                                              connect_timeout=LIVENESS_S) as ws:
                    return ws.subprotocol
            except ConnectionRejected as exc:
                return exc.status_code

        assert await attempt(base) == "dsh.v1"
        assert await attempt(f"http://127.0.0.1:{port + 1}") == 403
        assert await attempt(bridge.base) == 403  # Host 127.0.0.1:port, Origin another port
    assert ws_url(bridge)  # the bridge itself still answers directly


# --- F2: localhost binds every loopback address; docs finding 8: a port in use --------------

def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _run_web(web_daemon, tmp_path, listen: str, timeout: float = 60.0):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "client.cli", "web", "--listen", listen,
                           "--socket", str(web_daemon.socket),
                           "--token-file", str(tmp_path / "tok" / "web-token")],
                          capture_output=True, text=True, timeout=timeout)


def test_localhost_binds_both_loopbacks_and_prints_127(web_daemon, tmp_path):
    from tests.web.conftest import WebBridge

    if not _has_ipv6_loopback():
        pytest.skip("the kernel has no IPv6 loopback (::1 cannot be bound)")
    b = WebBridge(web_daemon.socket, tmp_path / "tok" / "web-token", listen="localhost:0")
    try:
        b.start()
        assert b.base.startswith("http://127.0.0.1:"), b.url
        for base in (b.base, f"http://[::1]:{b.port}"):
            r = httpx.get(f"{base}/", headers={"Host": f"localhost:{b.port}"}, timeout=LIVENESS_S)
            assert r.status_code == 401, (base, r.status_code)
    finally:
        b.close()


def test_a_squatter_on_ipv6_loopback_makes_localhost_exit_2(web_daemon, tmp_path):
    if not _has_ipv6_loopback():
        pytest.skip("the kernel has no IPv6 loopback (::1 cannot be bound)")
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as squatter:
        squatter.bind(("::1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        r = _run_web(web_daemon, tmp_path, f"localhost:{port}")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "token=" not in r.stdout
    assert f"[::1]:{port} is in use" in r.stderr, r.stderr


def test_a_port_in_use_says_what_to_do(web_daemon, tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        r = _run_web(web_daemon, tmp_path, f"127.0.0.1:{port}")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.strip().endswith(
        f"dsh web: 127.0.0.1:{port} is in use (another dsh web?): pick another with "
        "--listen 127.0.0.1:PORT, or port 0 for any free one"), r.stderr
    assert "Errno" not in r.stderr


def test_a_refused_websocket_handshake_carries_the_headers_too(bridge):
    cookie = sign_in(bridge)
    upgrade = {"Host": f"127.0.0.1:{bridge.port}", "Upgrade": "websocket", "Connection": "Upgrade",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13",
               "Origin": bridge.base, "Cookie": cookie, "Sec-WebSocket-Protocol": "dsh.v1"}
    status, headers = raw_get(bridge.port, "/ws", upgrade)
    assert status == 403, (status, headers)
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, (name, headers)
    assert headers.get("cache-control") == "no-cache", headers


def test_the_listen_host_is_a_host_name_in_any_case():
    """`--listen LOCALHOST:P` is localhost (both loopbacks bound, not refused as remote, and not
    127.0.0.1 alone with --allow-remote, which let a squatter on [::1] take the token: an
    outside attacker's finding). Host names compare case-insensitively."""
    from client.web.auth import is_loopback
    from client.web.serve import parse_listen

    assert parse_listen("LOCALHOST:8470") == ("localhost", 8470)
    assert parse_listen("[::1]:0") == ("::1", 0)
    host, _ = parse_listen("LocalHost:0")
    assert is_loopback(host)
