"""Fixtures of the TUI tests: a real dshd (``dshd.testing.DshdProcess``) and how to drive the
app on asyncio under this project's trio-mode pytest.

The project's runner is pytest-trio with ``trio_mode = true``: every ``async def`` test runs
on trio, and Textual needs asyncio. So the TUI tests are plain ``def`` tests that run their
scenario with :func:`run_app` (``asyncio.run`` of ``app.run_test``): trio mode never sees a
coroutine and the other tests are untouched.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from dshd.testing import DshdProcess
from client.tui.app import DshApp

#: The liveness bound of every wait (seconds): generous, the machine is shared.
BOUND_S = 30.0
SIZE = (120, 40)


class Daemon(DshdProcess):
    """A ``DshdProcess`` with the environment and a runner for the real ``dsh`` CLI."""

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, DSH_SOCKET=str(self.socket), DSH_STATE_DIR=str(self.state_dir))

    def dsh(self, *args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "client.cli", *args], env=self.env,
                              cwd=cwd, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    def dsh_popen(self, *args: str, cwd: str | None = None) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "client.cli", *args], env=self.env,
                                cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True)


def make_daemon(root: Path, config: str = "") -> Daemon:
    args: list[str] = []
    if config:
        (root / "dshd.toml").write_text(config)
        args = ["--config", str(root / "dshd.toml")]
    return Daemon(root, extra_args=args)


@pytest.fixture
def tui_root():
    root = Path(tempfile.mkdtemp(prefix="dsh-tui-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def daemon(tui_root):
    d = make_daemon(tui_root)
    d.start()
    yield d
    d.close()


@pytest.fixture
def workdir(tui_root):
    w = tui_root / "work"
    w.mkdir()
    return w


def run_app(app: DshApp, scenario: Callable[[Any], Awaitable[None]],
            size: tuple[int, int] = SIZE) -> None:
    """Run ``scenario(pilot)`` against ``app`` on a fresh asyncio loop."""

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await scenario(pilot)

    asyncio.run(main())


async def until(pilot: Any, condition: Callable[[], Any], what: str,
                bound: float = BOUND_S) -> Any:
    """Wait (bounded) until ``condition()`` is truthy, letting the app run meanwhile."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await pilot.pause(0.05)
    raise AssertionError(f"not within {bound} s: {what}")


def screen_text(app: DshApp) -> str:
    """Every line of the app's current screen as plain text."""
    return app.export_screenshot_text() if hasattr(app, "export_screenshot_text") else "\n".join(
        strip.text for strip in app.screen._compositor.render_strips())  # type: ignore[attr-defined]
