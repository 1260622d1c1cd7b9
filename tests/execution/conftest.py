"""Shared helpers for the execution tests (real subprocesses, real files)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

# `.venv/bin/pytest` does not put the repository root on sys.path unless the package is
# installed (`make install-test` does that); make the tests runnable either way.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


@pytest.fixture
def session_dir(tmp_path: Path) -> Path:
    d = tmp_path / "session"
    d.mkdir()
    return d
