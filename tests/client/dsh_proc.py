"""Running ``dsh`` as a subprocess against a real dshd or the fake peer (shared by the CLI
test modules)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]


def dsh_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "client.cli", *args]


def env_for(socket_path: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, DSH_SOCKET=socket_path, PYTHONPATH=str(ROOT), **extra)
    env.pop("COLUMNS", None)
    return env


async def dsh(socket_path: str | os.PathLike[str], *args: str, stdin: bytes = b"",
              cwd: str | os.PathLike[str] = ROOT) -> subprocess.CompletedProcess:
    """Run ``dsh ARGS`` to the end; ``stdin`` is fed and closed."""
    return await trio.run_process(dsh_cmd(*args), stdin=stdin, capture_stdout=True,
                                  capture_stderr=True, check=False,
                                  env=env_for(str(socket_path)), cwd=str(cwd))


class Live:
    """A ``dsh`` subprocess that keeps running: stdin is a pipe the test writes to, stdout and
    stderr go to files (read them any time)."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.out_path = tmp / f"{name}.out"
        self.err_path = tmp / f"{name}.err"
        self.proc: trio.Process | None = None

    async def start(self, socket_path: str | os.PathLike[str], *args: str,
                    cwd: str | os.PathLike[str] = ROOT) -> "Live":
        with self.out_path.open("wb") as fo, self.err_path.open("wb") as fe:
            self.proc = await trio.lowlevel.open_process(
                dsh_cmd(*args), stdin=subprocess.PIPE, stdout=fo, stderr=fe,
                env=env_for(str(socket_path)), cwd=str(cwd))
        return self

    @property
    def out(self) -> str:
        return self.out_path.read_text()

    @property
    def err(self) -> str:
        return self.err_path.read_text()

    async def until(self, text: str, *, timeout: float = 20) -> None:
        """Wait until stderr shows ``text``."""
        with trio.fail_after(timeout):
            while text not in self.err:
                if self.proc is not None and self.proc.returncode is not None:
                    raise AssertionError(f"dsh exited {self.proc.returncode}: {self.err}")
                await trio.sleep(0.02)

    async def write(self, data: bytes) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        await self.proc.stdin.send_all(data)

    async def close_stdin(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        await self.proc.stdin.aclose()

    async def wait(self, timeout: float = 20) -> int:
        assert self.proc is not None
        with trio.fail_after(timeout):
            return await self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
