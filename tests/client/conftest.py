"""Shared helpers of the client tests.

The repository root goes on ``sys.path`` so that ``client``/``protocol``/``dshd`` import when
pytest runs from the venv's script (the project is not necessarily installed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


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
