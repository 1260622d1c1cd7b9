"""Fixtures of the daemon-level storage fault tests: a real dshd process per test (short /tmp
root, since a Unix socket path is limited to 107 bytes), a workspace, and log helpers."""

from __future__ import annotations

import signal

import shutil
import tempfile
from pathlib import Path

import pytest

from crash.campaign import kill_marked
from dshd.testing import DshdProcess


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="dshd-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(root):
    d = DshdProcess(root)
    d.start()
    try:
        yield d
    finally:
        d.close(signal.SIGKILL)


@pytest.fixture
def workdir(root):
    w = root / "work"
    w.mkdir()
    return w


@pytest.fixture
def token():
    """A unique string to put in tool command lines, so leftovers can be killed by it."""
    import secrets

    t = "dshdur" + secrets.token_hex(6)
    try:
        yield t
    finally:
        kill_marked(t)
