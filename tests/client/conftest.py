"""Shared helpers of the client tests (pyproject's ``pythonpath`` makes the packages import)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _find_vectors() -> Path | None:
    for base in (ROOT, *ROOT.parents):
        candidate = base / "shared" / "conformance" / "ops-v1.json"
        if candidate.is_file():
            return candidate
    return None


@pytest.fixture(scope="session")
def ops_vectors() -> dict:
    path = _find_vectors()
    if path is None:
        pytest.fail("shared/conformance/ops-v1.json not found beside the repository")
    return json.loads(path.read_text())
