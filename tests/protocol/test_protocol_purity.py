"""protocol/ stays pure: stdlib + msgspec, no I/O modules (STYLE.md habit 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "protocol"
FORBIDDEN = {
    "trio", "socket", "os", "time", "asyncio", "subprocess", "threading", "select",
    "selectors", "signal", "multiprocessing", "io", "pathlib", "shutil", "tempfile",
    "importlib", "dshd", "client", "sys",
}


def forbidden_imports(source: str, filename: str = "<src>") -> list[str]:
    """Names of forbidden modules imported by ``source`` (any nesting, relative imports ok)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            names = ["__import__"]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in FORBIDDEN or top == "__import__":
                found.append(f"{filename}:{node.lineno}: {name}")
    return found


def test_checker_catches_forbidden_imports():
    assert forbidden_imports("import os")
    assert forbidden_imports("import time as t")
    assert forbidden_imports("from trio import sleep")
    assert forbidden_imports("def f():\n    import socket\n")
    assert forbidden_imports("import os.path")
    assert forbidden_imports("__import__('asyncio')")
    assert not forbidden_imports("import msgspec\nfrom .ops import x\nimport math, re")


def test_package_has_modules():
    names = {p.name for p in PACKAGE.glob("*.py")}
    assert {"__init__.py", "errors.py", "ops.py", "apply.py", "codec.py", "tracker.py", "rpc.py"} <= names


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_module_is_pure(path):
    assert forbidden_imports(path.read_text(encoding="utf-8"), str(path)) == []
