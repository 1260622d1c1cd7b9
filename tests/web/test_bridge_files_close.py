"""The page's files end their connection as the answer says (finding 4 of an outside client):
``GET /`` and ``/static/*`` with the cookie and ``Connection: close`` see EOF after the body,
and a kept-alive one is closed by hypercorn's keep-alive timer. Before, Starlette's
FileResponse cancelled hypercorn's close (and its keep-alive timer) inside its own last send,
and the socket stayed open until the client left. Real ``dsh web``, raw TCP sockets."""

from __future__ import annotations

import socket

import pytest

from tests.web.bridge_support import LIVENESS_S, sign_in


def _get_until_eof(port: int, path: str, cookie: str, *, close: bool) -> tuple[str, bytes]:
    """Send one GET; read until EOF (a socket timeout past LIVENESS_S fails the test)."""
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Cookie: {cookie}",
             *(["Connection: close"] if close else []), "", ""]
    with socket.create_connection(("127.0.0.1", port), timeout=LIVENESS_S) as s:
        s.sendall("\r\n".join(lines).encode("latin-1"))
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except socket.timeout:
            pytest.fail(f"GET {path}: no EOF within {LIVENESS_S} s after {len(data)} bytes")
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode("latin-1").lower(), body


@pytest.mark.parametrize("path", ["/", "/static/app.js"])
def test_a_page_file_with_connection_close_ends_after_its_body(bridge, path):
    cookie = sign_in(bridge)
    head, body = _get_until_eof(bridge.port, path, cookie, close=True)
    assert head.startswith("http/1.1 200") and "connection: close" in head, head
    length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
    assert len(body) == length


def test_a_kept_alive_page_file_is_closed_by_the_keep_alive_timer(bridge):
    cookie = sign_in(bridge)
    head, body = _get_until_eof(bridge.port, "/", cookie, close=False)
    assert head.startswith("http/1.1 200") and "connection: close" not in head, head
    assert body
