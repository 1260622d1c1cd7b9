"""``dsh web`` as a command (docs/WEB.md): loopback unless --allow-remote (else exit 2 with
the SSH tunnel sentence), the token file (0600 in a 0700 directory, reused across restarts,
replaced by --new-token), SIGTERM stops it cleanly, and the token never reaches a log."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from tests.web.bridge_support import LIVENESS_S, sign_in, ws_rpc
from tests.web.conftest import WebBridge

ROOT = Path(__file__).resolve().parents[2]


def dsh_web(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "client.cli", "web", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env=env)


@pytest.fixture
def scratch():
    d = Path(tempfile.mkdtemp(prefix="dsh-webc-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "192.0.2.7:8470", "example.com:0"])
def test_beyond_loopback_needs_allow_remote_and_says_how_to_tunnel(listen, scratch):
    r = dsh_web("--listen", listen, "--token-file", str(scratch / "t" / "web-token"))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    assert "ssh -L 8470:127.0.0.1:8470 HOST" in r.stderr, r.stderr
    assert "--allow-remote" in r.stderr
    assert not (scratch / "t" / "web-token").exists()  # refused before anything was made


def test_a_bad_listen_address_is_a_usage_error(scratch):
    r = dsh_web("--listen", "nonsense", "--token-file", str(scratch / "web-token"))
    assert r.returncode == 2 and "expected HOST:PORT" in r.stderr, r.stderr


def test_allow_remote_listens_on_every_address(web_daemon, scratch):
    b = WebBridge(web_daemon.socket, scratch / "web-token", listen="0.0.0.0:0",
                  extra_args=("--allow-remote",))
    try:
        url = b.start()
        assert url.startswith("http://127.0.0.1:")
        cookie = sign_in(b)
        r = httpx.get(b.base + "/", headers={"Cookie": cookie}, timeout=LIVENESS_S)
        assert r.status_code not in (401, 403)
        assert b.stop() == 0
    finally:
        b.close()


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_the_token_file_is_private_reused_and_replaced_by_new_token(web_daemon, scratch):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(scratch / "xdg"))
    (scratch / "xdg").mkdir(mode=0o700)
    b = WebBridge(web_daemon.socket, Path("unused"), env=env)
    b.command = lambda *more: [sys.executable, "-m", "client.cli", "web", "--listen", b.listen,
                               "--socket", str(b.socket), *more]  # the default token file
    try:
        b.start()
        token_file = scratch / "xdg" / "dsh" / "web-token"
        assert token_file.read_text().strip() == b.token
        assert mode(token_file) == 0o600 and mode(token_file.parent) == 0o700
        cookie = sign_in(b)
        first_token = b.token
        assert b.stop() == 0  # SIGTERM: a clean stop
        b.start()  # the same port and token file: the page's cookie still works
        assert b.token == first_token
        r = httpx.get(b.base + "/", headers={"Cookie": cookie}, timeout=LIVENESS_S)
        assert r.status_code not in (401, 403), r.status_code

        async def ws_works() -> None:
            async with ws_rpc(b, cookie) as rpc:
                await rpc.initialize()
        trio.run(ws_works)
        b.stop()
        b.start("--new-token")
        assert b.token != first_token
        assert token_file.read_text().strip() == b.token and mode(token_file) == 0o600
        r = httpx.get(b.base + "/", headers={"Cookie": cookie}, timeout=LIVENESS_S)
        assert r.status_code == 401  # the old cookie stopped working
        assert httpx.get(f"{b.base}/?token={first_token}", timeout=LIVENESS_S).status_code == 401
        assert sign_in(b) != cookie
    finally:
        b.close()


def test_a_token_file_others_can_read_is_refused(web_daemon, scratch):
    tok = scratch / "web-token"
    tok.write_text("x" * 43 + "\n")
    os.chmod(tok, 0o644)
    r = dsh_web("--listen", "127.0.0.1:0", "--socket", str(web_daemon.socket),
                "--token-file", str(tok))
    assert r.returncode == 2 and "readable by others" in r.stderr and "--new-token" in r.stderr
    assert "x" * 43 not in r.stderr


def test_the_token_is_in_no_log_line(bridge, web_daemon):
    cookie = sign_in(bridge)
    httpx.get(bridge.url, timeout=LIVENESS_S)  # followed redirect too
    httpx.get(bridge.url + "x", timeout=LIVENESS_S)  # a wrong token
    httpx.get(f"{bridge.base}/static/nothing.js?token={bridge.token}", timeout=LIVENESS_S)
    httpx.get(f"{bridge.base}/missing?token={bridge.token}&a=1", headers={"Cookie": cookie},
              timeout=LIVENESS_S)
    httpx.get(bridge.base + "/", headers={"Host": "evil.example"}, timeout=LIVENESS_S)
    httpx.get(bridge.base + "/", headers={"Cookie": cookie}, timeout=LIVENESS_S)

    async def sockets() -> None:
        async with ws_rpc(bridge, cookie) as rpc:
            await rpc.initialize()
            await rpc.result("session.list")
            await rpc.send_raw("not json")
            await rpc.receive()
        try:
            async with ws_rpc(bridge, cookie, origin="http://evil.example"):
                pass
        except Exception:  # noqa: BLE001 - refused, as test_bridge_http shows
            pass
    trio.run(sockets)
    bridge.stop()
    logs = {"dsh web stderr": bridge.log, "dshd log": web_daemon.log_path.read_text()}
    assert "signed in" in logs["dsh web stderr"] and "wrong token" in logs["dsh web stderr"]
    for name, text in logs.items():
        leaked = [line for line in text.splitlines() if bridge.token in line]
        assert not leaked, (name, leaked)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_bridge_cleanly_with_a_websocket_open(bridge, sig):
    import signal as _signal

    cookie = sign_in(bridge)
    closed: list[int] = []

    async def hold_one_open() -> None:
        async with ws_rpc(bridge, cookie) as rpc:
            await rpc.initialize()
            bridge.proc.send_signal(getattr(_signal, sig))
            from trio_websocket import ConnectionClosed
            try:
                with trio.fail_after(LIVENESS_S):
                    while True:
                        await rpc.ws.get_message()
            except ConnectionClosed as exc:
                closed.append(exc.reason.code)
    trio.run(hold_one_open)
    assert bridge.proc.wait(LIVENESS_S) == 0
    assert closed == [1001], closed  # going away, not dropped
    assert "Traceback" not in bridge.log, bridge.log
    assert f"stopping ({sig})" in bridge.log


def test_a_port_in_use_is_exit_2_and_the_first_bridge_keeps_serving(bridge):
    r = dsh_web("--listen", f"127.0.0.1:{bridge.port}", "--socket", str(bridge.socket),
                "--token-file", str(bridge.token_file))
    assert r.returncode == 2 and "in use" in r.stderr, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert sign_in(bridge)
