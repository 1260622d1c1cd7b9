"""The page's pure JavaScript (client/web/static/ansi.js's SGR parser) under ``node --test``:
tests/web/page/*.test.mjs. Skipped, with the reason, only when node is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed (apt-get install -y nodejs)")
def test_the_page_units_pass_under_node():
    files = sorted(str(p) for p in (HERE / "page").glob("*.test.mjs"))
    assert files, "no tests/web/page/*.test.mjs"
    r = subprocess.run(["node", "--test", *files], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# fail 0" in r.stdout and "# pass 0" not in r.stdout, r.stdout
