"""The JavaScript client's own tests: ``node --test tests/web/js/`` run from pytest.

Theory of operation: ``tests/web/js/*.test.mjs`` are ``node:test`` files (lane.js through every
conformance vector, the mirror's rules, rpc.js without a daemon). This module runs them with the
system ``node`` (``--experimental-websocket``: rpc.test.mjs opens real WebSockets) and the TAP
reporter, parses the summary (``# tests N``, ``# pass N``, ``# fail N``), and fails on any
failing or cancelled test, on a non-zero exit, and on a run of zero tests (a directory that
matched nothing must not pass). The vector counts the lane test prints as a diagnostic are
checked against conformance/ops-v1.json here too. Skipped only when ``node`` is not installed,
with that reason; node is Debian's ``nodejs`` (>= 20).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JS_TESTS = ROOT / "tests" / "web" / "js"
VECTORS = ROOT / "conformance" / "ops-v1.json"
NODE = shutil.which("node")

STATIC = ROOT / "client" / "web" / "static"
MAX_MODULE_LINES = 500  # tests/test_structure.py's bound, for the JavaScript modules too
needs_node = pytest.mark.skipif(
    NODE is None, reason="node is not installed (apt install nodejs, >= 20): the JS client tests need it"
)


def _summary(tap: str) -> dict[str, int]:
    found = dict(re.findall(r"^# (tests|pass|fail|cancelled|skipped|todo) (\d+)$", tap, re.M))
    return {k: int(v) for k, v in found.items()}


@pytest.fixture(scope="module")
def node_run() -> tuple[subprocess.CompletedProcess, dict[str, int]]:
    proc = subprocess.run(
        [NODE, "--experimental-websocket", "--test", "--test-reporter=tap", str(JS_TESTS)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    return proc, _summary(proc.stdout)


@needs_node
def test_node_tests_pass(node_run) -> None:
    proc, summary = node_run
    failing = re.findall(r"^\s*not ok \d+ - (.*)$", proc.stdout, re.M)
    report = f"node --test exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    assert "tests" in summary, "no TAP summary from node --test:\n" + report
    assert summary["tests"] > 0, "node --test ran 0 tests:\n" + report
    assert summary.get("fail", 0) == 0 and not failing, f"failing: {failing}\n" + report
    assert summary.get("cancelled", 0) == 0, report
    assert summary["pass"] == summary["tests"], report
    assert proc.returncode == 0, report


@needs_node
def test_every_vector_ran(node_run) -> None:
    proc, _ = node_run
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))
    recorder = sum(1 for c in vectors["apply"] if c.get("side") == "recorder")
    expected = (
        f"vectors ran: apply {len(vectors['apply']) - recorder}, encode {len(vectors['encode'])},"
        f" bad_wire {len(vectors['bad_wire'])} (skipped recorder-only: {recorder})"
    )
    assert expected in proc.stdout, f"expected {expected!r} in node's output:\n{proc.stdout[-3000:]}"


def test_js_modules_stay_under_500_lines() -> None:
    """Our own JavaScript (vendored code excepted) keeps the project's module bound."""
    modules = [p for p in STATIC.rglob("*.js") if "vendor" not in p.relative_to(STATIC).parts]
    assert len(modules) >= 5, modules  # lane, codec, connection, views, rpc at least
    over = {str(p.relative_to(ROOT)): n for p in modules
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not over, f"split these modules (over {MAX_MODULE_LINES} lines): {over}"
