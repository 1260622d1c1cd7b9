"""Sandbox fixtures: real providers (probed once per test session), an arena outside /tmp, and a
summary of the escape figures at the end of the run."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import trio


from dshd.execution.sandbox import Provider, probe

#: Lines printed in the terminal summary: "<provider>/<mode>: N cases, M escaped".
ESCAPE_REPORT: list[str] = []


def pytest_terminal_summary(terminalreporter) -> None:
    if ESCAPE_REPORT and not hasattr(terminalreporter.config, "workeroutput"):
        terminalreporter.section("sandbox escape suite")
        for line in ESCAPE_REPORT:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session) -> None:
    """Under pytest-xdist: hand the lines to the controller (tests/conftest.py prints them)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and ESCAPE_REPORT:
        workeroutput.setdefault("dsh_summary", {})["sandbox escape suite"] = list(ESCAPE_REPORT)


@pytest.fixture(scope="session")
def scratch_root() -> Path:
    """A directory outside /tmp (so that bwrap's private /tmp is not what protects it)."""
    root = Path(tempfile.mkdtemp(prefix="dsh-sandbox-test-", dir="/var/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def providers(scratch_root: Path) -> dict[str, Provider]:
    """``{"bwrap": ..., "landlock": ...}`` as forced probes return them (NoSandbox if broken)."""
    return {
        name: trio.run(lambda n=name: probe(n, scratch_dir=scratch_root / f"probe-{n}"))
        for name in ("bwrap", "landlock")
    }


@pytest.fixture
def provider_of(providers):
    """``provider_of(name)``: the working provider, or skip with the probe's reason."""

    def get(name: str) -> Provider:
        provider = providers[name]
        if provider.name != name:
            pytest.skip(f"{name} is not usable here: {provider.reason}")
        return provider

    return get
