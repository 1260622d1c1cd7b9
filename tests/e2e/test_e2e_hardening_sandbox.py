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
from protocol.rpc import RpcError

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
        self.daemon.start()

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
    """Issue 10 item 3, second half: the daemon notices that its state directory is no longer
    where it was (whoever moved it) and refuses confined calls, naming the path; moving it back
    makes them run again."""
    h = home_of(provider)
    work = h.root / "project"
    work.mkdir()
    async with connect(h.socket) as c:
        sid = await c.create_session(str(work))
        free = await c.create_session(str(work), sandbox="danger-full-access")
        ok = await _run(c, sid, "echo before")
        assert ok["exitCode"] == 0, ok
        parent = h.home / ".local" / "state"
        parent.rename(parent.with_name("state.x"))  # a rename from outside any sandbox
        try:
            refused = await _run(c, sid, f"echo ran > {work}/ran")
            assert refused["errorCode"] == "SANDBOX_UNAVAILABLE", refused
            assert str(h.state) in refused["content"], refused
            assert not (work / "ran").exists()
            assert (await _run(c, free, "true"))["exitCode"] == 0
        finally:
            parent.with_name("state.x").rename(parent)
        again = await _run(c, sid, "echo after")
        assert again["exitCode"] == 0, again
