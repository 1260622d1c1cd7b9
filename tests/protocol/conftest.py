"""Make the repository root importable when pytest runs without an installed ``dsh``.

(``pyproject.toml``'s ``[tool.pytest.ini_options] pythonpath = ["."]`` or ``pip install -e .``
would do the same; this keeps ``.venv/bin/pytest tests/protocol`` working either way.)
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
