"""The ``dsh`` CLI starts lazily: a command imports what it runs, not every command's modules.

Checked in a fresh interpreter (``sys.modules`` after the command), never by time: ``dsh
--version`` imports neither an event loop (trio, anyio), nor msgspec, nor rich, nor the
client library; ``dsh --help`` still lists every command; ``dsh status --help`` loads only
its own module (and ``dsh run`` no rich); the version printed is the installed
distribution's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest

import client
from client.cli.main import COMMANDS

PROBE = r"""
import json, sys
from client.cli.main import main
sys.argv = ["dsh", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as e:
    code = e.code
print("\nMODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def loaded_by(*args: str) -> tuple[str, set[str]]:
    """(stdout, the modules loaded) of ``dsh ARGS`` in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(args))],
                          capture_output=True, text=True, timeout=60)
    line = proc.stderr.rsplit("\nMODULES ", 1)[1]
    return proc.stdout, set(json.loads(line))


def top_level(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_version_imports_no_event_loop_no_msgspec_no_rich_no_client_library():
    out, modules = loaded_by("--version")
    assert out == f"dsh {metadata.version('dsh')}\n"
    heavy = top_level(modules) & {"trio", "anyio", "msgspec", "rich", "asyncio", "protocol"}
    assert not heavy, f"dsh --version imported {sorted(heavy)}"
    assert not {m for m in modules if m.startswith("client.") and m != "client.cli"
                and not m.startswith("client.cli.main")}, sorted(m for m in modules
                                                             if m.startswith("client."))


def test_client_version_is_the_installed_distribution():
    assert client.__version__ == metadata.version("dsh")


def test_help_lists_every_command():
    out, _ = loaded_by("--help")
    listed = {line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == set(COMMANDS)


@pytest.mark.parametrize("name", ["status", "run"])
def test_a_command_loads_its_own_module_not_the_others(name):
    _, modules = loaded_by(name, "--help")
    commands = {m for m in modules if m.startswith("client.cli.")} - {"client.cli.main"}
    own = COMMANDS[name][0]
    assert own in commands
    others = {module for module, _ in COMMANDS.values()} - {own}
    assert not commands & others, f"dsh {name} --help loaded {sorted(commands & others)}"
    if name == "run":  # rich is for tables and notes, loaded when one is written
        assert "rich" not in top_level(modules)


def test_the_package_exports_stay_reachable():
    from client import Client, Mirror, RpcError, connect  # noqa: F401 - lazily resolved

    assert client.connect is connect
    with pytest.raises(AttributeError):
        client.no_such_name  # noqa: B018
