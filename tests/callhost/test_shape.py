"""The call host's shape: standard library only, no other dshd module; sentences."""

from __future__ import annotations

import ast
import errno
import sys
from pathlib import Path

import dshd.callhost
from dshd.callhost import child

PACKAGE = Path(dshd.callhost.__file__).resolve().parent
SIBLINGS = {p.stem for p in PACKAGE.glob("*.py")}


def test_the_host_imports_the_standard_library_and_its_siblings_only():
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # from . import x: a sibling
                    assert node.level == 1 and node.module in (None, *SIBLINGS), path
                    continue
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in SIBLINGS \
                        and top != "__future__":
                    offenders.append(f"{path.name}:{node.lineno}: {name}")
    assert offenders == []


def test_a_resource_limit_is_named_in_the_spawn_sentence():
    sentence = child.failure_sentence("fork", errno.EAGAIN, "/bin/sh", "/")
    assert "resource limit" in sentence and "EAGAIN" in sentence and "pids.max" in sentence
    assert "/work" in child.failure_sentence("chdir", errno.ENOTDIR, "/bin/sh", "/work")


def test_every_module_but_the_script_imports_as_the_package():
    import importlib

    for name in sorted(SIBLINGS - {"__init__", "main"}):
        module = importlib.import_module(f"dshd.callhost.{name}")
        assert module.__doc__ and "Theory of operation" in module.__doc__, name
