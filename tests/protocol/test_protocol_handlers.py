"""The daemon's side of the method table: one handler per method, results are the table's
structs, refusals are dshd.errors classes mapped once (dshd/handlers/dispatch.py)."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

from dshd import handlers
from dshd.handlers import AfterResponse
from protocol import methods

DSHD = Path(__file__).resolve().parents[2] / "dshd"


def _sources() -> dict[str, ast.AST]:
    """The handler modules (``dshd/handlers/*.py``; before the split, ``dshd/handlers.py``)."""
    paths = sorted((DSHD / "handlers").glob("*.py")) or [DSHD / "handlers.py"]
    sources = {p.name: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in paths}
    assert sources
    return sources


def _called_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def test_only_dispatch_makes_an_error_response():
    """Before: handlers.py built ``rpc.RpcError`` / ``encode_error`` at 31 sites."""
    sites = [(name, node.lineno) for name, tree in _sources().items() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _called_name(node) in ("RpcError", "encode_error")
             and name != "dispatch.py"]
    assert sites == []
    dispatch = _sources()["dispatch.py"]
    maps = [n for n in ast.walk(dispatch)
            if isinstance(n, ast.Call) and _called_name(n) == "to_rpc_error"]
    assert len(maps) == 1


def test_no_builtin_exception_stands_for_not_found():
    """Before: ``except KeyError`` meant "call not found" in tool.wait and tool.cancel."""
    builtin = {"KeyError", "LookupError", "IndexError", "ValueError"}
    caught = []
    for name, tree in _sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                names = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)}
                caught += [(name, node.lineno, n) for n in names & builtin]
    assert caught == []


def test_every_method_has_one_handler_returning_its_result_struct():
    assert set(handlers.HANDLERS) == set(methods.METHODS)
    for name, handler in handlers.HANDLERS.items():
        hints = typing.get_type_hints(handler, globalns=vars(inspect.getmodule(handler)))
        params = list(inspect.signature(handler).parameters)
        assert hints[params[1]] is methods.METHODS[name].params, name
        assert hints["return"] in (methods.METHODS[name].result, AfterResponse), name
