"""Shared helpers of the storage tests: real files under tmp_path, real fsync."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"
