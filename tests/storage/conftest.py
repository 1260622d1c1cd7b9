"""Shared helpers of the storage tests: real files under tmp_path, real fsync.

The repository root goes on ``sys.path`` so that ``dshd``/``protocol`` import when pytest runs
from the venv's script (the project is not necessarily installed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"
