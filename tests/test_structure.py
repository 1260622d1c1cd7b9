"""The project's shape, read from its source with ``ast`` (issue 11 "Must show").

Theory of operation: every ``.py`` file under ``protocol/``, ``dshd/`` and ``client/`` is
parsed once. Imports are collected from the whole tree of each file -- module level, inside
``if TYPE_CHECKING:``, inside functions (a lazy import is still an edge) -- and resolved to
project modules: relative imports against the importing module's package, ``from X import Y``
to the module ``X.Y`` when that file exists, else to ``X``. A package's implicit import of its
parents is not an edge (every submodule would otherwise be in a cycle with an ``__init__`` that
imports it). Each rule below is its own test and its message lists every offender as
``file:line``, so a failing run is a to-do list.

Rules:

* no import cycle between project modules (strongly connected components of the graph);
* ``client/`` never imports ``dshd``;
* ``protocol/`` imports no I/O module (:data:`IO_MODULES`) and nothing of ``dshd``/``client``;
* nothing in ``dshd/`` outside ``dshd/sessions/`` reads a session's internals: an attribute
  in :data:`SESSION_INTERNALS` (``log tracker publisher results``), any attribute naming a
  nursery, or any ``_private`` attribute, read on a receiver that names a session -- a
  variable ``session``, ``s``, ``sess`` or ending in ``_session``, or an attribute
  ``<anything>.session`` (``self.session``, ``desk.session``). What it catches:
  ``session.log.append``, ``s.tracker.set``, ``self.session.publisher``,
  ``s._calls_nursery``. What it cannot: a session under another name (``x = session``;
  ``owner.log``), one reached through a container or a call (``registry.open[sid].log``,
  ``get().tracker``), ``getattr(session, "log")``, and what a session *method* hands out
  (a port method that returns the tracker). The rule is about reads and writes alike (an
  ``ast.Attribute`` is both);
* no function (or method, or nested function: each counts whole) over
  :data:`MAX_FUNCTION_LINES` lines, ``def`` line to last line, docstring included;
* no module over :data:`MAX_MODULE_LINES` lines.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "dshd", "client")
IO_MODULES = frozenset({
    "trio", "anyio", "socket", "os", "pathlib", "subprocess", "threading", "asyncio",
    "select", "selectors", "signal", "multiprocessing", "shutil", "tempfile", "io",
})
SESSION_INTERNALS = frozenset({"log", "tracker", "publisher", "results"})
SESSION_NAMES = frozenset({"session", "s", "sess"})
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500


@dataclass(frozen=True)
class Edge:
    source: str  # importing module (dotted)
    target: str  # imported project module, or the external top-level name
    path: str  # importing file, relative to the repository
    line: int
    where: str  # "", "TYPE_CHECKING" or "in a function"

    def __str__(self) -> str:
        note = f" ({self.where})" if self.where else ""
        return f"{self.path}:{self.line}: {self.source} -> {self.target}{note}"


@dataclass
class Module:
    name: str
    rel: str  # the file, relative to the repository
    tree: ast.Module
    lines: int
    is_package: bool
    edges: list[Edge] = field(default_factory=list)  # project modules
    external: list[Edge] = field(default_factory=list)  # everything else (top-level names)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """``(node, where)`` for every import anywhere in ``tree``."""
    def walk(node: ast.AST, where: str):
        for child in ast.iter_child_nodes(node):
            here = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                here = where or "in a function"
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, where
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                        yield stmt, "TYPE_CHECKING"
                    yield from walk(stmt, "TYPE_CHECKING")
                for stmt in child.orelse:
                    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                        yield stmt, where
                    yield from walk(stmt, where)
                continue
            yield from walk(child, here)
    yield from walk(tree, "")


def resolve(module: Module, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """Dotted names ``node`` imports (project modules resolved; others as written)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
        if node.level > 1:
            package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    out = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}" if base else alias.name
        out.append(candidate if candidate in known else base)
    return out


def _project_target(name: str, known: set[str]) -> str | None:
    parts = name.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def load(root: Path, packages=PACKAGES) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            name = module_name(path, root)
            modules[name] = Module(name, str(path.relative_to(root)), ast.parse(text, str(path)),
                                   len(text.splitlines()), path.name == "__init__.py")
    known = set(modules)
    for module in modules.values():
        rel = module.rel
        for node, where in _imports(module.tree):
            for name in dict.fromkeys(resolve(module, node, known)):
                target = _project_target(name, known)
                if target is not None:
                    if target != module.name:
                        module.edges.append(Edge(module.name, target, rel, node.lineno, where))
                else:
                    module.external.append(
                        Edge(module.name, name.split(".")[0], rel, node.lineno, where))
    return modules


@cache
def project() -> dict[str, Module]:
    return load(ROOT)


# ----------------------------------------------------------------------------- the rules
def import_cycles(modules: dict[str, Module]) -> list[list[str]]:
    """One entry per strongly connected component of more than one module: a cycle through
    it, then every import edge inside it (``file:line``)."""
    graph = {name: sorted({e.target for e in m.edges}) for name, m in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan, iterative enough for this graph's depth
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    report = []
    for component in sorted(components):
        members = set(component)
        cycle = _a_cycle(graph, component[0], members)
        edges = [str(e) for name in component for e in modules[name].edges if e.target in members]
        report.append([" -> ".join(cycle)] + sorted(edges))
    return report


def _a_cycle(graph: dict[str, list[str]], start: str, members: set[str]) -> list[str]:
    """A shortest import path from ``start`` back to itself inside ``members`` (BFS)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in graph[v]:
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, v, start]
                if w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    return [start]


def client_imports_dshd(modules: dict[str, Module]) -> list[str]:
    return [str(e) for m in modules.values() if m.name.split(".")[0] == "client"
            for e in m.edges + m.external if e.target.split(".")[0] == "dshd"]


def protocol_impurities(modules: dict[str, Module]) -> list[str]:
    out = []
    for m in modules.values():
        if m.name.split(".")[0] != "protocol":
            continue
        out += [str(e) for e in m.external if e.target in IO_MODULES]
        out += [str(e) for e in m.edges if e.target.split(".")[0] in ("dshd", "client")]
    return out


def _names_a_session(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in SESSION_NAMES or node.id.endswith("_session")
    if isinstance(node, ast.Attribute):
        return node.attr == "session" or node.attr.endswith("_session")
    return False


def _internal(attr: str) -> bool:
    if attr.startswith("__") and attr.endswith("__"):
        return False
    return attr in SESSION_INTERNALS or attr.startswith("_") or "nursery" in attr


def session_internals_outside(modules: dict[str, Module]) -> list[str]:
    out = []
    for m in modules.values():
        parts = m.name.split(".")
        if parts[0] != "dshd" or parts[:2] == ["dshd", "sessions"]:
            continue
        for node in ast.walk(m.tree):
            if (isinstance(node, ast.Attribute) and _internal(node.attr)
                    and _names_a_session(node.value)):
                out.append(f"{m.rel}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(out), key=_by_file_line)


def long_functions(modules: dict[str, Module], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    out = []
    for m in modules.values():
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    out.append(f"{m.rel}:{node.lineno}: {node.name} ({length} lines)")
    return sorted(out, key=_by_file_line)


def long_modules(modules: dict[str, Module], limit: int = MAX_MODULE_LINES) -> list[str]:
    return sorted(f"{m.rel}:1: {m.lines} lines" for m in modules.values() if m.lines > limit)


def _by_file_line(entry: str) -> tuple[str, int]:
    path, line, _ = entry.split(":", 2)
    return path, int(line)


def _offenders(title: str, entries: list) -> str:
    lines = []
    for entry in entries:
        if isinstance(entry, list):
            lines.append(f"  cycle {entry[0]}")
            lines += [f"    {edge}" for edge in entry[1:]]
        else:
            lines.append(f"  {entry}")
    return f"{title} ({len(entries)}):\n" + "\n".join(lines)


# ----------------------------------------------------------------------------- the tests
def test_the_walk_sees_the_whole_project():
    modules = project()
    assert {"protocol.rpc", "dshd.server", "dshd.sessions.session", "client.api"} <= set(modules)
    # A TYPE_CHECKING import and a relative one are edges (dshd.connection imports both).
    edges = {(e.target, e.where) for e in modules["dshd.connection"].edges}
    assert ("dshd.sessions.streams", "TYPE_CHECKING") in edges and ("dshd.daemon", "") in edges


def test_no_import_cycles():
    cycles = import_cycles(project())
    assert not cycles, _offenders("import cycles between project modules", cycles)


def test_client_never_imports_dshd():
    found = client_imports_dshd(project())
    assert not found, _offenders("client/ imports dshd", found)


def test_protocol_imports_no_io_module():
    found = protocol_impurities(project())
    assert not found, _offenders("protocol/ imports I/O modules or the daemon/client", found)


def test_nothing_outside_sessions_reads_session_internals():
    found = session_internals_outside(project())
    assert not found, _offenders(
        "session internals (log, tracker, publisher, results, nursery, _private) read outside "
        "dshd/sessions/", found)


def test_no_function_over_80_lines():
    found = long_functions(project())
    assert not found, _offenders(f"functions over {MAX_FUNCTION_LINES} lines", found)


def test_no_module_over_500_lines():
    found = long_modules(project())
    assert not found, _offenders(f"modules over {MAX_MODULE_LINES} lines", found)


# ----------------------------------------------------------------------------- the checkers
def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return load(tmp_path)


def test_the_checkers_catch_what_they_claim(tmp_path):
    body = "\n".join(f"    x = {i}" for i in range(80))
    modules = _tree(tmp_path, {
        "protocol/__init__.py": "",
        "protocol/a.py": "import msgspec\nfrom os import path\n",
        "protocol/b.py": "def f():\n    import trio\n",
        "dshd/__init__.py": "",
        "dshd/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .y import Y\n",
        "dshd/y.py": "from . import x\n",
        "dshd/sessions/__init__.py": "",
        "dshd/sessions/session.py": "def f(session):\n    return session.log\n",
        "dshd/agent.py": ("def f(session, s):\n    session.log.append(1)\n    s.tracker.set()\n"
                          "    return s._calls_nursery, session.info(), s.__class__\n"
                          "class T:\n    def g(self):\n        return self.session.publisher\n"),
        "dshd/long.py": f"def long():\n{body}\n" + "\n" * 420,
        "client/__init__.py": "",
        "client/c.py": "import dshd.storage\n",
    })
    assert import_cycles(modules)[0][0] == "dshd.x -> dshd.y -> dshd.x"
    assert client_imports_dshd(modules) == ["client/c.py:1: client.c -> dshd"]
    assert [e.split(": ")[1] for e in protocol_impurities(modules)] == [
        "protocol.a -> os", "protocol.b -> trio (in a function)"]
    assert [e.split(": ", 1)[1] for e in session_internals_outside(modules)] == [
        "session.log", "s.tracker", "s._calls_nursery", "self.session.publisher"]
    assert long_functions(modules) == ["dshd/long.py:1: long (81 lines)"]
    assert long_modules(modules) == ["dshd/long.py:1: 501 lines"]
