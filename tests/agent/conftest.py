"""Agent-loop fixtures: a FAKE model server and an in-process dshd pointed at it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


from dshd.config import Config
from dshd.server import serve
from tests.agent.fake_model_server import FakeModelServer
from tests.agent.helpers import fast_model


@pytest.fixture
def fake_model():
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def short_root():
    """A short directory under /tmp (a Unix socket path is limited to 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="dsh-ag-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def workdir(tmp_path):
    w = tmp_path / "work"
    w.mkdir()
    return w


@pytest.fixture
def model_overrides():
    """Override in a test module (or parametrize) to change the [model] table."""
    return {}


@pytest.fixture
def config_overrides():
    """Override to change other daemon settings."""
    return {}


@pytest.fixture
async def dshd(nursery, short_root, fake_model, model_overrides, config_overrides):
    """dshd in this process (``serve``), its model the fake server; cancelled at teardown."""
    config = Config(
        socket=str(short_root / "run" / "dshd.sock"),
        state_dir=str(short_root / "state"),
        model=fast_model(fake_model.url, **model_overrides),
        log_level="warning",
        **config_overrides,
    )
    daemon = await nursery.start(serve, config)
    yield daemon
