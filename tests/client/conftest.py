"""Shared helpers of the client tests (pyproject's ``pythonpath`` makes the packages import)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


VECTORS_PATH = ROOT / "conformance" / "ops-v1.json"


@pytest.fixture(scope="session")
def ops_vectors() -> dict:
    if not VECTORS_PATH.is_file():
        pytest.fail(f"{VECTORS_PATH} is missing: the conformance vectors are part of the repository")
    return json.loads(VECTORS_PATH.read_text())
