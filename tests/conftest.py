"""Suite-wide hooks: the run is spread over pytest-xdist workers (``make test`` passes ``-n``).

A test package that prints figures in the terminal summary (the sandbox escape suite) does so
from its own conftest when the run has no workers. Under xdist the controller never loads that
conftest, so the package hands its lines over in ``config.workeroutput["dsh_summary"]``
(``{title: [line, ...]}``) and this file prints them once every worker is done.
"""

from __future__ import annotations

import pytest

#: ``{title: [line, ...]}`` gathered from the workers.
SUMMARY: dict[str, list[str]] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    for title, lines in (getattr(node, "workeroutput", None) or {}).get("dsh_summary", {}).items():
        SUMMARY.setdefault(title, []).extend(lines)


def pytest_terminal_summary(terminalreporter) -> None:
    for title, lines in SUMMARY.items():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
