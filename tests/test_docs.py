"""The contract in docs/ against the code: what can be checked mechanically, is.

Theory of operation: each test collects a set from the code (the daemon's method table and
params structs, the error-code constants it uses, the event types it appends, the Config
fields and their defaults, the dsh exit statuses, the spec sections cited in docstrings, the
keys of real answers of a real dshd) and the matching set from the documents, and compares
them. Every collection asserts that it found something, so that a broken collector fails
instead of passing empty. Adding a method, an error code, an event type, a config key or an
exit status without documenting it fails here; so does a document that names one the code
does not have.
"""

from __future__ import annotations

import ast
import json
import re
import socket
import tomllib
from pathlib import Path

import pytest

from client import exits
from dshd import handlers, tools
from dshd.config import Config, ModelConfig
from dshd.storage.format import KNOWN_TYPES
from protocol import methods, rpc

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SPECS = ("PROTOCOL", "OPS", "STORAGE", "EXEC", "HOST")


def doc(name: str) -> str:
    return (DOCS / f"{name}.md").read_text(encoding="utf-8")


def section(text: str, number: str) -> str:
    """The text of ``## number.`` up to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(number)}\.? .*$", text, re.M)
    assert m, f"no section {number}"
    level = len(m.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, m.end())
    return text[m.end(): end.start() if end else len(text)]


def names_in(text: str) -> set[str]:
    """Every ``"word"`` and every backticked word of ``text``."""
    return set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', text)) | set(
        re.findall(r"`([A-Za-z_][A-Za-z0-9_./-]*)`", text)
    )


def method_segment(text: str, method: str) -> str:
    """From a method's signature (`` `method {`` or a line ``method {``) to the next bullet,
    heading or code fence."""
    m = re.search(rf"`{re.escape(method)} \{{|^{re.escape(method)} \{{", text, re.M)
    assert m, f"method {method} is not documented in PROTOCOL.md"
    ends = [i for i in (text.find(s, m.end()) for s in ("\n- ", "\n#", "\n```")) if i != -1]
    return text[m.start(): min(ends) if ends else len(text)]


def py_sources(*dirs: str) -> list[Path]:
    files = [p for d in dirs for p in sorted((ROOT / d).rglob("*.py"))]
    assert files
    return files


# ---------------------------------------------------------------------- methods and params
def documented_methods() -> set[str]:
    text = doc("PROTOCOL")
    found = set(re.findall(r"`([a-z]+(?:\.[A-Za-z]+)?) \{", text))
    found |= set(re.findall(r"^([a-z]+(?:\.[A-Za-z]+)?) \{", text, re.M))
    return found - set(tools.TOOLS) - set(methods.NOTIFICATIONS)


def test_every_method_is_documented_and_every_documented_method_exists():
    names = set(methods.METHODS)
    assert len(names) >= 16
    assert documented_methods() == names


def test_the_daemon_has_one_handler_for_each_method_of_the_table():
    assert set(handlers.HANDLERS) == set(methods.METHODS)


@pytest.mark.parametrize("method", sorted(methods.METHODS))
def test_every_param_of_a_method_is_documented(method):
    params_type = methods.METHODS[method].params
    segment = method_segment(doc("PROTOCOL"), method)
    missing = [f for f in params_type.__struct_encode_fields__ if f'"{f}"' not in segment]
    assert not missing, f"{method}: params {missing} are not in PROTOCOL.md"


# ---------------------------------------------------------------------- error codes
def test_every_error_code_is_in_protocol_section_4():
    errors = section(doc("PROTOCOL"), "4")
    documented = {int(c) for c in re.findall(r"`(-32\d{3})`", errors)}
    used = set()
    for path in py_sources("dshd"):
        for name in re.findall(r"\brpc\.([A-Z][A-Z0-9_]{2,}[A-Z0-9])\b", path.read_text(encoding="utf-8")):
            value = getattr(rpc, name)
            if isinstance(value, int):
                used.add(value)
    assert len(used) >= 14
    assert used <= set(rpc.ERROR_NAMES)
    assert used <= documented, f"used but not in §4: {sorted(used - documented)}"
    assert documented == set(rpc.ERROR_NAMES), "§4 and protocol.rpc.ERROR_NAMES differ"


def _upper_constants() -> dict[str, set[str]]:
    """Every string literal LIKE_THIS in dshd/ (symbolic codes, environment variables), minus
    names of Python objects (those listed in an ``__all__``)."""
    pattern = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
    found: dict[str, set[str]] = {}
    exported: set[str] = set()
    for path in py_sources("dshd"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                exported |= {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)}
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if pattern.match(node.value):
                    found.setdefault(node.value, set()).add(str(path.relative_to(ROOT)))
    return {k: v for k, v in found.items() if k not in exported}


def test_every_symbolic_code_and_environment_variable_is_documented():
    text = "\n".join(doc(n) for n in SPECS) + (DOCS / "README.md").read_text(encoding="utf-8")
    text += (ROOT / "README.md").read_text(encoding="utf-8")
    wildcards = set(re.findall(r"\b([A-Z][A-Z0-9]*_)\*", text))
    constants = _upper_constants()
    assert {"TOOL_OUTCOME_UNKNOWN", "APPROVAL_REJECTED", "LOG_DAMAGED", "DSH_CALL_ID"} <= set(constants)
    missing = {
        name: sorted(where) for name, where in constants.items()
        if not re.search(rf"\b{name}\b", text) and not any(name.startswith(w) for w in wildcards)
    }
    assert not missing, f"not in docs/: {missing}"


def test_tool_error_codes_are_in_the_exec_table():
    table = section(doc("EXEC"), "1")
    rows = {c for line in table.splitlines() if line.startswith("| `")
            for c in re.findall(r"`([A-Z_]+)`", line.split("|")[1])}
    from dshd.sessions.approval import WHY
    from dshd.results import SENTENCES
    from dshd.storage import repair

    codes = set(SENTENCES) | {code for code, _ in WHY.values()}
    codes |= {repair.TOOL_NOT_STARTED, repair.TOOL_OUTCOME_UNKNOWN}
    assert codes <= rows, f"missing from EXEC.md §1: {sorted(codes - rows)}"
    never_ran = {line.split("|")[1] for line in table.splitlines() if line.rstrip().endswith("| no |")}
    from client.exits import NEVER_RAN_CODES

    assert {c for c in NEVER_RAN_CODES} <= {c for r in never_ran for c in re.findall(r"[A-Z_]{5,}", r)}


def test_exec_section_1_quotes_every_sentence_of_dshd_results():
    """EXEC.md §1's sentence table is dshd/results.SENTENCES, row for row, verbatim."""
    from dshd.results import SENTENCES

    rows: dict[tuple[str, str], str] = {}
    for line in section(doc("EXEC"), "1").splitlines():
        m = re.match(r"^\| `([A-Z_]+)` \| (`[a-z-]+`|—) \| (.*) \|$", line)
        if m:
            key = (m.group(1), "" if m.group(2) == "—" else m.group(2).strip("`"))
            assert key not in rows, f"EXEC.md §1 lists {key} twice"
            rows[key] = m.group(3)
    expected = {(code, variant): text for code, variants in SENTENCES.items()
                for variant, text in variants.items()}
    assert len(expected) >= 20
    assert set(rows) == set(expected), (
        f"not in EXEC.md §1: {sorted(set(expected) - set(rows))}; "
        f"not in dshd/results.py: {sorted(set(rows) - set(expected))}"
    )
    differ = {k: (rows[k], expected[k]) for k in expected if rows[k] != expected[k]}
    assert not differ, differ


# ---------------------------------------------------------------------- event types
def _written_event_types() -> tuple[set[str], set[str]]:
    """(types appended by the daemon, those appended with ignorable=True)."""
    written, ignorable = set(), set()
    type_re = re.compile(r"^[a-z]+/[a-z]+$")
    for path in py_sources("dshd"):  # log.append(...), or the session port's record(...)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("append", "record") and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str) and type_re.match(node.args[0].value)):
                written.add(node.args[0].value)
                if any(k.arg == "ignorable" and isinstance(k.value, ast.Constant) and k.value.value
                       for k in node.keywords):
                    ignorable.add(node.args[0].value)
            elif (isinstance(node, ast.Tuple) and len(node.elts) == 3
                    and all(isinstance(e, ast.Constant) for e in node.elts[::2])
                    and isinstance(node.elts[0].value, str) and type_re.match(node.elts[0].value)
                    and isinstance(node.elts[2].value, bool)):
                # a settings change recorded as (type, data, ignorable) by Session._record_durably
                written.add(node.elts[0].value)
                if node.elts[2].value:
                    ignorable.add(node.elts[0].value)
    repair_src = (ROOT / "dshd/storage/repair.py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(repair_src)):
        if isinstance(node, ast.Tuple) and node.elts and isinstance(node.elts[0], ast.Constant):
            value = node.elts[0].value
            if isinstance(value, str) and type_re.match(value):
                written.add(value)
    return written, ignorable


def test_every_event_type_is_in_storage_section_3():
    events = section(doc("STORAGE"), "3")
    table: dict[str, str] = {}
    for line in events.splitlines():
        if line.startswith("| `"):
            for t in re.findall(r"`([a-z]+/[a-z]+)`", line.split("|")[1]):
                table[t] = line
    written, ignorable = _written_event_types()
    assert len(written) >= 14 and {"session/owner", "session/env"} <= ignorable
    assert written <= set(table), f"written but not in §3: {sorted(written - set(table))}"
    assert set(table) == KNOWN_TYPES | ignorable
    for t in ignorable:
        assert "ignorable" in table[t], f"{t} is written ignorable; §3 must say so"


# ---------------------------------------------------------------------- config keys
def _config_rows() -> dict[str, str]:
    rows = {}
    for line in (DOCS / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `([a-z_.]+)` \| (`[^`]*`|—) \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def _config_defaults() -> dict[str, object]:
    config = Config()
    out = {f: getattr(config, f) for f in Config.__struct_fields__ if f != "model"}
    out.update({f"model.{f}": getattr(config.model, f) for f in ModelConfig.__struct_fields__})
    return out


def test_every_config_key_is_in_docs_readme_with_its_default():
    rows, defaults = _config_rows(), _config_defaults()
    assert len(defaults) >= 30
    assert set(rows) == set(defaults), (
        f"undocumented: {sorted(set(defaults) - set(rows))}; "
        f"not config keys: {sorted(set(rows) - set(defaults))}"
    )
    for key, cell in rows.items():
        documented = None if cell == "—" else tomllib.loads(f"v = {cell.strip('`')}")["v"]
        actual = defaults[key]
        assert documented == actual and type(documented) is type(actual), (
            f"{key}: docs/README.md says {cell}, dshd/config.py says {actual!r}"
        )


# ---------------------------------------------------------------------- dsh exit statuses
def test_readme_exit_table_is_the_generated_one_and_covers_every_status():
    """README.md's "`dsh` exit status" table is `dsh help exit-codes --markdown` (from
    client/exits.EXIT_TABLE), and that table has a row for every EXIT_* constant."""
    from client.cli.help import exit_table_markdown

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## `dsh` exit status")[1].split("\n## ")[0]
    table = table[table.index("| status | meaning |"):].rstrip("\n") + "\n"
    generated = exit_table_markdown()
    assert table == generated, (
        "README.md's exit table differs from client/exits.EXIT_TABLE: paste the output of "
        "`dsh help exit-codes --markdown` there")
    documented = {int(n) for n in re.findall(r"`(\d+)`", "".join(
        line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `")))}
    statuses = {v for k, v in vars(exits).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert len(statuses) >= 7
    assert statuses | {0} <= documented, (
        f"client/exits.py has {sorted(statuses)}; EXIT_TABLE lists {sorted(documented)}")


def test_docs_readme_points_to_the_one_exit_table_instead_of_a_second_copy():
    text = (DOCS / "README.md").read_text(encoding="utf-8")
    section = text.split("## `dsh` exit status")[1].split("\n## ")[0]
    assert "dsh help exit-codes" in section and "../README.md" in section
    assert not re.search(r"^\| `\d+` \|", section, re.M), "a second exit table in docs/README.md"


# ---------------------------------------------------------------------- citations, paths
def _sections(name: str) -> set[str]:
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", doc(name), re.M))


def test_spec_citations_in_the_code_name_existing_sections():
    cited = re.compile(r"\b(PROTOCOL|OPS|STORAGE|EXEC|HOST)\.md §(\d+(?:\.\d+)?)(?:[–-]§(\d+(?:\.\d+)?))?")
    sections = {n: _sections(n) for n in SPECS}
    assert all(len(s) >= 4 for s in sections.values())
    seen, bad = 0, []
    for path in py_sources("dshd", "protocol", "client"):
        for m in cited.finditer(path.read_text(encoding="utf-8")):
            seen += 1
            for number in filter(None, m.group(2, 3)):
                if number not in sections[m.group(1)]:
                    bad.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert seen >= 50
    assert not bad, bad


def test_nothing_in_readme_docs_or_tests_points_outside_the_repository():
    needle = "../" + "shared"
    hits = [
        str(p.relative_to(ROOT))
        for p in [ROOT / "README.md", *DOCS.rglob("*"), *(ROOT / "tests").rglob("*")]
        if p.is_file() and p.suffix in (".md", ".py", ".json", ".toml", ".txt")
        and needle in p.read_text(encoding="utf-8", errors="replace")
    ]
    assert not hits, hits


def test_conformance_readme_names_every_key_of_the_vectors():
    vectors = json.loads((ROOT / "conformance" / "ops-v1.json").read_text(encoding="utf-8"))
    readme = (ROOT / "conformance" / "README.md").read_text(encoding="utf-8")
    keys = set(vectors)
    for kind in ("apply", "encode", "bad_wire"):
        for case in vectors[kind]:
            keys |= set(case)
    assert {"side", "expect", "wire", "final"} <= keys
    assert keys <= names_in(readme), sorted(keys - names_in(readme))
    assert vectors["spec"] == "docs/OPS.md" and (ROOT / vectors["spec"]).is_file()
    kinds = {c["error"] for kind in ("apply", "bad_wire") for c in vectors[kind] if "error" in c}
    assert kinds <= names_in(section(doc("OPS"), "2"))


# ---------------------------------------------------------------------- real answers
class _Peer:
    """A raw JSON-RPC connection to a real dshd (no client library: what the wire says)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(20)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rwb")
        self.notes: list[dict] = []
        self.next_id = 0

    def call(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}
        self.file.write(json.dumps(message).encode() + b"\n")
        self.file.flush()
        while True:
            answer = json.loads(self.file.readline())
            if answer.get("id") == self.next_id:
                assert "result" in answer, answer
                return answer["result"]
            self.notes.append(answer)

    def note(self) -> dict:
        if self.notes:
            return self.notes.pop(0)
        return json.loads(self.file.readline())

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def _undocumented(value: dict, text: str) -> list[str]:
    return sorted(set(value) - names_in(text))


def test_real_answers_carry_only_documented_keys(tmp_path):
    from dshd.testing import DshdProcess

    protocol, storage = doc("PROTOCOL"), doc("STORAGE")
    lane = protocol.split("Lane view")[1].split("```")[1]
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / "d").mkdir()
    daemon = DshdProcess(tmp_path / "d")
    daemon.start()
    peer = None
    try:
        peer = _Peer(daemon.socket)
        init = peer.call("initialize", {"protocolVersion": 1, "capabilities": {"approvals": True}})
        assert not _undocumented(init, method_segment(protocol, "initialize"))
        status = peer.call("daemon.status")
        seg = method_segment(protocol, "daemon.status") + section(protocol, "3.6")
        assert not _undocumented(status, seg) and not _undocumented(status["sandbox"], seg)
        sid = peer.call("session.create", {"cwd": str(workspace), "title": "docs"})["sessionId"]
        info = peer.call("session.get", {"sessionId": sid})
        assert not _undocumented(info, method_segment(protocol, "session.list"))
        first = peer.call("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                       "arguments": {"command": "echo hi"}, "callId": "one"})
        again = peer.call("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                                       "arguments": {"command": "echo hi"}, "callId": "one"})
        assert again.get("existing") is True
        seg = method_segment(protocol, "tool.run")
        assert not _undocumented(first, seg) and not _undocumented(again, seg)
        result = peer.call("tool.wait", {"sessionId": sid, "callId": "one"})
        seg = method_segment(protocol, "tool.wait")
        assert not _undocumented(result, seg) and not _undocumented(result["details"], seg)
        assert not _undocumented(result["details"]["truncation"], lane)
        events = peer.call("session.events", {"sessionId": sid})
        assert not _undocumented(events, method_segment(protocol, "session.events"))
        for event in events["events"]:
            assert not _undocumented(event, section(storage, "3")), event
        peer.call("tool.run", {"sessionId": sid, "name": "bash", "approved": True,
                               "arguments": {"command": "sleep 30"}, "callId": "slow"})
        sub = peer.call("subscribe", {"sessionId": sid})
        assert not _undocumented(sub, method_segment(protocol, "subscribe"))
        base = peer.note()
        assert base["method"] == "stream" and base["params"]["seq"] == 0
        view = base["params"]["ops"][0][1]
        assert not _undocumented(view, lane) and not _undocumented(view["session"], lane)
        entry = view["tools"]["slow"]
        assert not _undocumented(entry, lane) and not _undocumented(entry["output"], lane)
        assert not _undocumented(view["recent"][0], lane)
        cancel = peer.call("tool.cancel", {"sessionId": sid, "callId": "slow"})
        assert cancel == {"cancelled": True}
        assert not _undocumented(peer.call("tool.wait", {"sessionId": sid, "callId": "slow"}),
                                 method_segment(protocol, "tool.wait"))
    finally:
        if peer is not None:
            peer.close()
        daemon.stop()


def test_repair_sentences_are_quoted_verbatim_in_storage_section_5():
    from dshd.storage import repair

    text = " ".join(section(doc("STORAGE"), "5").split())
    sentences = (repair.NOT_STARTED_TEXT, repair.OUTCOME_UNKNOWN_TEXT, repair.NOT_GRANTED_TEXT,
                 repair.LAST_OUTPUT_INTRO)
    missing = [s for s in sentences if f'"{s}"' not in text]
    assert not missing, missing
