"""What one client (or one bad value) does never takes the daemon down for everybody else.

Regression tests for what a fresh tester broke: a subscriber vanishing with unread data, a
poisoned session env, running out of file descriptors, a refused peer left half-open."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import trio

from client.api import connect
from protocol.rpc import RpcError

from .conftest import daemon_with_nofile, throwaway_user


def _raw_subscriber(path, sid: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(path))
    s.sendall(
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": 1}}).encode() + b"\n"
        + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "subscribe",
                      "params": {"sessionId": sid}}).encode() + b"\n"
    )
    return s


async def test_subscribers_vanishing_with_unread_data(daemon, workdir):
    async with connect(daemon.socket) as c:
        sid = await c.create_session(str(workdir))
        stalled = [_raw_subscriber(daemon.socket, sid) for _ in range(4)]
        cid = await c.run_tool(
            sid, "for i in $(seq 1 8); do head -c 2000000 /dev/urandom | base64; sleep 0.1; done",
            approved=True,
        )
        sub = await c.subscribe(sid)
        async for view in sub:  # wait until output is flowing, then drop the readers
            tool = view["tools"].get(cid)
            if tool and tool["output"]["truncation"]["totalBytes"] > 4_000_000:
                break
        for s in stalled:
            s.close()
        result = await c.wait(sid, cid)
        assert result["exitCode"] == 0
        # base64 of 2,000,000 bytes: 2,666,668 chars + 35,088 newlines, 8 times.
        assert result["details"]["truncation"]["totalBytes"] == 8 * 2_701_756
    assert daemon.proc.poll() is None


async def test_invalid_session_env_is_refused(daemon, workdir):
    async with connect(daemon.socket) as c:
        for env in ({"A": "x\0y"}, {"": "x"}, {"A=B": "x"}):
            with pytest.raises(RpcError) as exc:
                await c.create_session(str(workdir), env=env)
            assert exc.value.code == -32602 and "env" in exc.value.message
        sid = await c.create_session(str(workdir), env={"GREETING": "hi there"})
        cid = await c.run_tool(sid, 'echo "$GREETING"', approved=True)
        assert (await c.wait(sid, cid))["content"] == "hi there\n"


@pytest.fixture
def low_fd_daemon():
    with daemon_with_nofile(64) as d:
        yield d


async def test_running_out_of_file_descriptors_is_survived(low_fd_daemon, workdir):
    d = low_fd_daemon
    socks = []
    for _ in range(100):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(str(d.socket))
        except OSError:
            s.close()
            break
        socks.append(s)
    await trio.sleep(0.3)  # let the accept loop hit EMFILE
    assert d.proc.poll() is None
    for s in socks:
        s.close()
    # Once the fds are back, it serves as before.
    with trio.fail_after(30):
        while True:
            try:
                async with connect(d.socket) as c:
                    sid = await c.create_session(str(workdir))
                    cid = await c.run_tool(sid, "echo alive", approved=True)
                    assert (await c.wait(sid, cid))["content"] == "alive\n"
                    break
            except Exception:
                await trio.sleep(0.1)
    log = d.log_path.read_text()
    assert "accept.out_of_resources" in log and "accept.recovered" in log
    # One line per episode: trio.serve_listeners' own line per 100 ms retry is not written.
    assert "accept returned" not in log and log.count("accept.out_of_resources") <= 5


@pytest.fixture
def unprivileged_user():
    with throwaway_user("dshpeer", keep=True, tools=("useradd",)) as entry:
        yield entry


def test_a_foreign_peer_is_refused_and_closed(daemon, unprivileged_user):
    # Let the other user reach the socket at all (the 0700 dir / 0600 socket normally stop it)
    # so that the daemon's own SO_PEERCRED check is what refuses it.
    os.chmod(daemon.socket.parent, 0o711)
    os.chmod(daemon.socket, 0o666)
    os.chmod(daemon.root, 0o711)
    code = (
        "import socket,sys\n"
        f"s=socket.socket(socket.AF_UNIX); s.connect({str(daemon.socket)!r})\n"
        "f=s.makefile('rb'); print(f.readline().decode().strip())\n"
        "try:\n"
        "    s.sendall(b'{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"daemon.status\"}\\n')\n"
        "    print('closed' if f.readline() == b'' else 'answered')\n"
        "except (ConnectionResetError, BrokenPipeError):\n"
        "    print('closed')\n"
    )
    u = unprivileged_user
    r = subprocess.run(["setpriv", f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}", "--clear-groups",
                        sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert len(r.stdout.splitlines()) == 2, (r.stdout, r.stderr)
    first, second = r.stdout.splitlines()
    assert json.loads(first)["error"]["code"] == -32001
    assert second == "closed"  # no answer: the daemon closed the connection
