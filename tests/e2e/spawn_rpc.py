"""A deliberately small JSON-RPC 2.0 client and daemon launcher for the spawn hardening tests.

Theory of operation: the tests of issue 10 (items 1, 7, 8, 20, 22) must keep guarding while
the layers above ``protocol/`` are restructured, so they speak to a real ``dshd`` only through
its documented wire: one Unix socket, one JSON object per line (PROTOCOL.md). Nothing here
imports the daemon's or the client's internals; :class:`Daemon` wraps ``dshd.testing``'s
launcher (a real ``python -m dshd``) with a config file and an environment of the test's choice.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from dshd.testing import DshdProcess


class Rpc:
    """One connection: ``call(method, params)`` sends a request and returns the response object
    (notifications in between are skipped). ``timeout``: seconds per read (a liveness bound)."""

    def __init__(self, path: Path | str, timeout: float = 120.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.next_id = 0
        init = self.call("initialize", {"protocolVersion": 1})
        assert "result" in init, init
        self.server = init["result"]

    def call(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        request = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            request["params"] = params
        self.sock.sendall(json.dumps(request).encode() + b"\n")
        while True:
            line = self.file.readline()
            if not line:
                raise ConnectionError(f"dshd closed the connection during {method}")
            msg = json.loads(line)
            if msg.get("id") == self.next_id:
                return msg

    def result(self, method: str, params: dict | None = None) -> dict:
        msg = self.call(method, params)
        assert "result" in msg, (method, msg)
        return msg["result"]

    def session(self, cwd: Path | str, **extra) -> str:
        return self.result("session.create", {"cwd": str(cwd), **extra})["sessionId"]

    def start(self, sid: str, command: str, **arguments) -> str:
        params = {"sessionId": sid, "name": "bash", "approved": True,
                  "arguments": {"command": command, **arguments}}
        return self.result("tool.run", params)["callId"]

    def wait(self, sid: str, cid: str, timeout: float = 100.0) -> dict:
        return self.result("tool.wait", {"sessionId": sid, "callId": cid, "timeout": timeout})

    def run(self, sid: str, command: str, **arguments) -> dict:
        return self.wait(sid, self.start(sid, command, **arguments))

    def events(self, sid: str) -> list[dict]:
        return self.result("session.events", {"sessionId": sid})["events"]

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class Daemon(DshdProcess):
    """A real dshd with ``config`` (TOML text) and exactly ``env`` as its environment (plus its
    socket variables); ``prefix``: argv put in front (``prlimit``, ``setpriv``…); ``python``:
    the interpreter, default this one."""

    def __init__(self, config: str = "", *, env: dict[str, str] | None = None,
                 prefix: list[str] | None = None, root: Path | None = None,
                 python: str | None = None) -> None:
        root = root or Path(tempfile.mkdtemp(prefix="dsh-spawn-"))
        cfg = root / "dshd.toml"
        cfg.write_text(config)
        super().__init__(root, extra_args=["--config", str(cfg)])
        # Like dshd.testing's launcher: the daemon's own socket variables are in its environment
        # (the tests check they never reach a tool).
        self.env = dict(env if env is not None else os.environ, DSH_SOCKET=str(self.socket),
                        DSH_STATE_DIR=str(self.state_dir))
        self.prefix = list(prefix or [])
        self.python = python

    def command(self) -> list[str]:
        argv = super().command()
        if self.python is not None:
            argv[0] = self.python
        return [*self.prefix, *argv]

    def spawn(self) -> subprocess.Popen:
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(self.command(), stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL, env=self.env)

    def rpc(self, timeout: float = 120.0) -> Rpc:
        return Rpc(self.socket, timeout)

    def __enter__(self) -> "Daemon":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()  # the daemon and every call host it left (HOST.md §7)
        shutil.rmtree(self.root, ignore_errors=True)
