"""Shared helpers for the execution tests (real subprocesses, real files)."""

from __future__ import annotations

from pathlib import Path

import pytest



@pytest.fixture
def session_dir(tmp_path: Path) -> Path:
    d = tmp_path / "session"
    d.mkdir()
    return d
