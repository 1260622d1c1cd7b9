"""Shared helpers of the client tests (pyproject's ``pythonpath`` makes the packages import).

``real_dshd`` is a real daemon (``dshd.testing.DshdProcess``: ``python -m dshd`` on a real
socket) shared by a test module; ``backend`` runs a library test once on trio and once on
asyncio: the test is a plain function that calls ``on(backend, fn)``, which runs ``fn`` with
``anyio.run`` and checks it really ran on that loop (pytest-trio's trio mode claims every
``async def`` test for trio, so the asyncio runs cannot be async tests).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
import pytest
import sniffio

from dshd.testing import DshdProcess

ROOT = Path(__file__).resolve().parents[2]


VECTORS_PATH = ROOT / "conformance" / "ops-v1.json"


@pytest.fixture(scope="session")
def ops_vectors() -> dict:
    if not VECTORS_PATH.is_file():
        pytest.fail(f"{VECTORS_PATH} is missing: the conformance vectors are part of the repository")
    return json.loads(VECTORS_PATH.read_text())


@pytest.fixture(params=["trio", "asyncio"])
def backend(request) -> str:
    return request.param


def on(backend: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``fn`` on ``backend`` (asserting it is that loop that runs it)."""

    async def checked() -> Any:
        assert sniffio.current_async_library() == backend
        return await fn()

    return anyio.run(checked, backend=backend)


def start_dshd(prefix: str = "dsh-cl-") -> DshdProcess:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: sun_path is 107 bytes
    daemon = DshdProcess(root)
    try:
        daemon.start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return daemon


def stop_dshd(daemon: DshdProcess) -> None:
    """Stop the daemon and end every call host it left (hosts outlive a daemon's stop)."""
    daemon.close()
    shutil.rmtree(daemon.root, ignore_errors=True)


@pytest.fixture(scope="module")
def real_dshd():
    daemon = start_dshd()
    try:
        yield daemon
    finally:
        stop_dshd(daemon)
