"""Suite-wide hooks: the run is spread over pytest-xdist workers (``make test`` passes ``-n``).

A test package that prints figures in the terminal summary (the sandbox escape suite) does so
from its own conftest when the run has no workers. Under xdist the controller never loads that
conftest, so the package hands its lines over in ``config.workeroutput["dsh_summary"]``
(``{title: [line, ...]}``) and this file prints them once every worker is done.

Ctrl-C as a person sends it: a suite started in the background of a shell without job control
(``make test &``, a CI runner's detached step) inherits SIGINT *ignored*, and an ignored
signal stays ignored across exec, so every ``dsh`` a test starts would ignore the SIGINT the
test sends as its Ctrl-C (``dsh log -f``, ``dsh attach --follow`` never ended). A person's
terminal never ignores it: this process (controller and each worker, at import) takes Python's
default handler back, so the programs it starts get the default disposition at exec.
"""

from __future__ import annotations

import signal

import pytest

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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
