"""Sandbox escapes of issue 10 (items 3–6), against a real ``dshd`` over its socket.

Each test starts its own daemon (``dshd.testing.DshdProcess``) with a real provider (bwrap or
Landlock, forced by config) and judges on the host: did a file change, did a socket accept,
did the daemon survive. They talk only JSON-RPC, so they keep guarding after the layer above
``protocol/`` is restructured.

* item 3 — a session whose cwd holds the state directory and the socket (cwd = a HOME-like
  directory): a tool cannot rename the masked path's ancestors, and when something else moves
  the state directory, every confined call fails closed naming it;
* item 4 — system directories are refused as a session's cwd; a workspace under /tmp works;
  a workspace-write tool cannot write the host's ``/proc/sys``;
* item 5 — a Landlock-confined tool cannot reach dshd's socket (even at a guessed path), nor
  send UDP;
* item 6 — a tool filling its private /tmp gets ENOSPC, the daemon lives on.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from client.api import connect
from dshd.testing import DshdProcess
from protocol.rpc import STORAGE_FAILURE, RpcError

PROVIDERS = ["bwrap", "landlock"]


class Home:
    """A HOME-like directory with dshd's state dir and socket under it, and a daemon on it."""

    def __init__(self, provider: str, extra_config: str = "") -> None:
        # Under /var/tmp, not /tmp: bwrap's private /tmp must not be what protects anything.
        self.root = Path(tempfile.mkdtemp(prefix="dsh-h-", dir="/var/tmp"))
        self.home = self.root / "home"
        self.state = self.home / ".local" / "state" / "dsh"
        self.socket = self.home / ".local" / "state" / "run" / "dshd.sock"
        self.socket.parent.mkdir(parents=True)
        cfg = self.root / "dshd.toml"
        cfg.write_text(f'sandbox_provider = "{provider}"\n{extra_config}')
        self.daemon = DshdProcess(
            self.root, state_dir=self.state, socket_path=self.socket,
            extra_args=["--config", str(cfg)],
        )
        try:
            self.daemon.start()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def close(self) -> None:
        self.daemon.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def home_of():
    made: list[Home] = []

    def make(provider: str, extra_config: str = "") -> Home:
        h = Home(provider, extra_config)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


async def _run(c, sid: str, command: str) -> dict:
    return await c.wait(sid, await c.run_tool(sid, command, approved=True))


def _probe_socket_script(path: str) -> str:
    return (
        "python3 -c \"import socket,sys; s=socket.socket(socket.AF_UNIX); "
        f"s.connect('{path}'); print('CONNECTED')\" 2>&1"
    )


# ------------------------------------------------------------------------------- item 3
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_renaming_the_state_dirs_parent_does_not_unmask_it(home_of, provider):
    """Issue 10 item 3: ``mv .local/state .local/state.x`` from a session whose cwd is HOME,
    then read the other session's files and drive dshd through its moved socket."""
    h = home_of(provider)
    async with connect(h.socket) as c:
        other = await c.create_session(str(h.home), sandbox="danger-full-access")
        await _run(c, other, "echo other-session-output")
        sid = await c.create_session(str(h.home))  # workspace-write, cwd = HOME
        first = await _run(c, sid, "mv .local/state .local/state.x; echo rc=$?")
        assert h.state.is_dir() and h.socket.exists(), first  # nothing moved on the host
        moved = h.home / ".local" / "state.x"
        second = await _run(
            c, sid,
            f"ls -A .local/state.x/dsh/sessions .local/state/dsh/sessions 2>&1; "
            f"echo pwn > .local/state.x/dsh/planted; echo pwn > .local/state/dsh/planted; "
            + _probe_socket_script(str(moved / "run" / "dshd.sock")) + "; "
            + _probe_socket_script(str(h.socket)),
        )
    assert not moved.exists(), (first, second)
    assert other not in second["content"], second
    assert "CONNECTED" not in second["content"], second
    assert not (h.state / "planted").exists()
    if provider == "landlock":
        # Landlock cannot mask beneath a writable workspace: such a call is refused outright.
        assert first["errorCode"] == "SANDBOX_UNAVAILABLE", first
        assert str(h.state) in first["content"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_moved_state_dir_fails_every_confined_call_closed(home_of, provider):
    """Issue 10 item 3, second half: the daemon notices that its socket or state directory is no
    longer where it was (whoever moved it) and no confined call runs, naming the path; moving it
    back makes them run again.

    Moving the socket's directory is the sandbox's own check (SANDBOX_UNAVAILABLE; unconfined
    calls still run). Moving the state directory is caught first by the session writer, whose
    lock no longer guards the path (STORAGE.md §4): the call is refused before its barrier
    passes, as -32014 or a STORAGE_FAILURE/SANDBOX_UNAVAILABLE result, and never runs."""
    h = home_of(provider)
    work = h.root / "project"
    work.mkdir()
    async with connect(h.socket) as c:
        sid = await c.create_session(str(work))
        free = await c.create_session(str(work), sandbox="danger-full-access")
        ok = await _run(c, sid, "echo before")
        assert ok["exitCode"] == 0, ok
        # 1. The socket's directory moves: the sandbox check refuses confined calls.
        run_dir = h.socket.parent
        run_dir.rename(run_dir.with_name("run.x"))
        try:
            refused = await _run(c, sid, f"echo ran > {work}/ran")
            assert refused["errorCode"] == "SANDBOX_UNAVAILABLE", refused
            assert str(h.socket) in refused["content"], refused
            assert not (work / "ran").exists()
            assert (await _run(c, free, "true"))["exitCode"] == 0
        finally:
            run_dir.with_name("run.x").rename(run_dir)
        assert (await _run(c, sid, "echo between"))["exitCode"] == 0
        # 2. The state directory's parent moves: nothing confined runs.
        parent = h.home / ".local" / "state"
        parent.rename(parent.with_name("state.x"))
        try:
            try:
                answer = await _run(c, sid, f"echo ran > {work}/ran")
            except RpcError as exc:
                assert exc.code == STORAGE_FAILURE, exc
                said = str(exc)
            else:
                assert answer["errorCode"] in ("SANDBOX_UNAVAILABLE", "STORAGE_FAILURE"), answer
                said = answer["content"]
            assert str(h.state) in said, said
            assert not (work / "ran").exists()
            status = await c.call("daemon.status", {})
            assert status["pid"] > 0
        finally:
            parent.with_name("state.x").rename(parent)
        again = await _run(c, sid, "echo after")
        assert again["exitCode"] == 0, again


# ------------------------------------------------------------------------------- item 4
SYSTEM_DIRS = ["/", "/proc", "/proc/sys", "/proc/self", "/etc", "/sys", "/sys/kernel", "/tmp",
               "/dev", "/dev/shm", "/run", "/usr", "/usr/bin", "/bin", "/boot", "/var", "/home",
               "/lib"]


@pytest.fixture
def bwrap_home(home_of):
    return home_of("bwrap")


async def test_system_directories_are_refused_as_a_session_directory(bwrap_home, tmp_path):
    """Issue 10 item 4: cwd=/proc (and /, /etc, /sys, /tmp, ...) voided the sandbox (the
    workspace bind covered the sandbox's own /proc). Refused at session.create with -32602
    naming the rule — also through a symlink."""
    link = tmp_path / "proc-link"
    link.symlink_to("/proc")
    refused = [d for d in SYSTEM_DIRS if os.path.isdir(d)] + [str(link)]
    async with connect(bwrap_home.socket) as c:
        for directory in refused:
            for mode in ("workspace-write", "read-only", "danger-full-access"):
                with pytest.raises(RpcError) as exc:
                    await c.create_session(directory, sandbox=mode)
                assert exc.value.code == -32602, (directory, exc.value)
                assert "cannot be a session directory" in exc.value.message, exc.value.message
                assert directory in exc.value.message
        assert not [s for s in await c.list_sessions()]  # nothing was created


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_workspace_under_tmp_still_works(home_of, provider):
    """EXEC.md §3: the workspace is bound at its path "even when it lies under /tmp"."""
    h = home_of(provider)
    project = Path(tempfile.mkdtemp(prefix="dsh-proj-", dir="/tmp"))
    try:
        (project / "seen").write_text("here\n")
        async with connect(h.socket) as c:
            sid = await c.create_session(str(project))
            result = await _run(c, sid, "cat seen && echo made > made && echo ok")
        assert result["exitCode"] == 0, result
        assert result["content"] == "here\nok\n"
        assert (project / "made").read_text() == "made\n"
    finally:
        shutil.rmtree(project, ignore_errors=True)


@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_tool_cannot_write_the_hosts_sysctls(home_of, provider, mode):
    """Issue 10 item 4: a workspace-write tool changed kernel.printk_ratelimit. The same value
    is written back, so even a failing test changes nothing on the host."""
    h = home_of(provider)
    work = h.root / "project"
    work.mkdir()
    target = Path("/proc/sys/kernel/printk_ratelimit")
    value = target.read_text().strip()
    async with connect(h.socket) as c:
        assert c.server["sandbox"]["provider"] == provider
        sid = await c.create_session(str(work), sandbox=mode)
        result = await _run(c, sid, f"echo {value} > {target} && echo WROTE")
    assert "WROTE" not in result["content"], result
    assert result["exitCode"] != 0
    assert target.read_text().strip() == value


# ------------------------------------------------------------------------------- item 5
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_confined_tool_cannot_drive_dshd_through_its_socket(home_of, provider):
    """Issue 10 item 5: under Landlock a tool ran ``dsh run --sandbox danger-full-access --
    touch OUTSIDE`` through dshd's socket. The tool is told the socket's real path here, as if
    it had guessed it: environment scrubbing alone is no defence."""
    h = home_of(provider)
    work = h.root / "project"
    work.mkdir()
    outside = h.root / "OUTSIDE"
    # The client is a stdlib-only script run by the system's python3 (DRIVE_DSHD below): the
    # repository may lie under /tmp, which bwrap's private /tmp hides from the tool.
    (work / "drive.py").write_text(DRIVE_DSHD.format(alias=h.daemon.socket, work=work,
                                                     outside=outside))
    dsh = f"/usr/bin/python3 -I {work}/drive.py"
    async with connect(h.daemon.socket) as c:
        sid = await c.create_session(str(work))
        direct = await _run(c, sid, _probe_socket_script(str(h.daemon.socket)))
        via_cli = await _run(c, sid, dsh + "; echo rc=$?")
        sessions = await c.list_sessions()
    assert "CONNECTED" not in direct["content"], direct
    assert not outside.exists(), via_cli
    assert "rc=0" not in via_cli["content"], via_cli
    assert len(sessions) == 1  # the tool created no session of its own


@pytest.mark.parametrize("network", [False, True])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_udp_is_denied_while_the_network_is_off(home_of, provider, network):
    """Issue 10 item 5: UDP/DNS got out of Landlock's workspace-write (Landlock has no UDP
    rules; the launcher's seccomp filter denies it). With ``network = true`` it gets out —
    the control that shows the check can see a datagram (bwrap: the host's loopback)."""
    import socket

    h = home_of(provider, f"network = {'true' if network else 'false'}\n")
    work = h.root / "project"
    work.mkdir()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.setblocking(False)
        port = listener.getsockname()[1]
        async with connect(h.socket) as c:
            sid = await c.create_session(str(work))
            result = await _run(
                c, sid,
                "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
                f" s.sendto(b'x', ('127.0.0.1', {port})); print('SENT')\" 2>&1",
            )
        try:
            listener.recv(16)
            received = True
        except BlockingIOError:
            received = False
    assert received == network, result
    if provider == "landlock":  # refused at socket(); bwrap's own loopback takes the datagram
        assert ("SENT" in result["content"]) == network, result


# ------------------------------------------------------------------------------- item 6
async def _daemon_alive(c) -> None:
    status = await c.status()
    assert status["sandbox"]["provider"] == "bwrap"


@pytest.mark.parametrize("cap_mib", [None, 8])
async def test_filling_the_private_tmp_gets_enospc_and_the_daemon_lives(home_of, cap_mib):
    """Issue 10 item 6: an uncapped tmpfs let a tool OOM-kill dshd. Default cap 512 MiB
    (``dd`` of 600 MiB fails); a configured 8 MiB cap (``dd`` of 16 MiB fails)."""
    cap = (cap_mib or 512) * 1024 * 1024
    h = home_of("bwrap", f"tmp_size_bytes = {cap}\n" if cap_mib else "")
    work = h.root / "project"
    work.mkdir()
    count = 600 if cap_mib is None else 16
    async with connect(h.socket) as c:
        sid = await c.create_session(str(work))
        result = await _run(
            c, sid,
            f"dd if=/dev/zero of=/tmp/big bs=1M count={count} 2>&1 | grep -o 'No space left on "
            "device' | head -1; stat -c %s /tmp/big; "
            f"head -c {2 * cap} /dev/zero > /dev/shm/big 2>/dev/null; stat -c %s /dev/shm/big",
        )
        await _daemon_alive(c)
    lines = result["content"].splitlines()
    assert lines[0] == "No space left on device", result
    assert int(lines[1]) <= cap, result
    assert int(lines[2]) <= cap, result  # /dev/shm is capped too
    assert h.daemon.running


async def test_the_sum_of_running_calls_tmp_is_bounded(home_of):
    """Issue 10 item 6: the private /tmp of all running calls together is bounded
    (``tmp_total_bytes``); the call past it fails closed, and runs again once one ended."""
    mib = 1024 * 1024
    # per call: /tmp 8 MiB + /dev/shm 8 MiB + /run 4 MiB = 20 MiB; room for two calls.
    h = home_of("bwrap", f"tmp_size_bytes = {8 * mib}\ntmp_total_bytes = {45 * mib}\n")
    work = h.root / "project"
    work.mkdir()
    hold = "touch started-$DSH_CALL_ID; while [ ! -e stop ]; do sleep 0.05; done; echo held"
    async with connect(h.socket) as c:
        sid = await c.create_session(str(work))
        held = []
        for _ in range(2):
            cid = await c.run_tool(sid, hold, approved=True)
            held.append(cid)
            for _ in range(400):  # bounded: until the call's sandbox is up
                if (work / f"started-{cid}").exists():
                    break
                await __import__("trio").sleep(0.05)
            assert (work / f"started-{cid}").exists()
        third = await _run(c, sid, "echo ran")
        assert third["errorCode"] == "SANDBOX_UNAVAILABLE", third
        assert "tmp_total_bytes" in third["content"], third
        (work / "stop").touch()
        for cid in held:
            assert (await c.wait(sid, cid))["exitCode"] == 0
        again = await _run(c, sid, "echo ran")
        assert again["exitCode"] == 0 and again["content"] == "ran\n", again
        await _daemon_alive(c)


DRIVE_DSHD = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect("{alias}")
f = s.makefile("rb")
def call(i, method, params):
    s.sendall(json.dumps({{"jsonrpc": "2.0", "id": i, "method": method, "params": params}}).encode() + b"\\n")
    answer = json.loads(f.readline())
    if "error" in answer:
        print(answer["error"]["message"])
        sys.exit(1)
    return answer["result"]
call(1, "initialize", {{"protocolVersion": 1}})
sid = call(2, "session.create", {{"cwd": "{work}", "sandbox": "danger-full-access"}})["sessionId"]
call(3, "tool.run", {{"sessionId": sid, "name": "bash", "callId": "x", "approved": True,
                     "arguments": {{"command": "touch {outside}"}}}})
sys.exit(call(4, "tool.wait", {{"sessionId": sid, "callId": "x", "timeout": 30}})["exitCode"])
"""


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_confined_tool_is_refused_even_through_an_alias_of_the_socket(home_of, provider):
    """Issue 10 item 5, the daemon's side: a hard link of dshd's socket inside the workspace
    (the mask covers only the socket's own path) still must not let a tool drive dshd. bwrap:
    the peer check recognises the connecting process as one of this daemon's sandboxes;
    Landlock: the seccomp filter refuses the socket. A client outside any sandbox is served on
    the same alias (the control)."""
    h = home_of(provider)
    work = h.root / "project"
    work.mkdir()
    alias = work / "alias.sock"
    os.link(h.daemon.socket, alias)
    outside = h.root / "OUTSIDE"
    # A stdlib-only client in the workspace, run by the system's python3: the repository and
    # its venv may lie under /tmp, which bwrap's private /tmp hides from the tool.
    (work / "drive.py").write_text(DRIVE_DSHD.format(alias=alias, work=work, outside=outside))
    dsh = f"/usr/bin/python3 -I {work}/drive.py; echo rc=$?"
    async with connect(alias) as c:  # the control: the alias reaches the daemon
        sid = await c.create_session(str(work))
        result = await _run(c, sid, dsh)
        assert not outside.exists(), result
        # No false positive: an unconfined tool may still use dsh (through the same alias).
        free = await c.create_session(str(work), sandbox="danger-full-access")
        unconfined = await _run(c, free, dsh)
        assert outside.exists() and "rc=0" in unconfined["content"], unconfined
        outside.unlink()
    assert "rc=0" not in result["content"], result
    if provider == "bwrap":
        assert "permission denied" in result["content"], result
        assert "connection.confined_peer" in h.daemon.log_path.read_text()
