"""A `make -j2` of a small C project through `dsh run` survives three daemon restarts
mid-build and produces the same binary as an undisturbed build (issue 13 "Must show").

Theory: the fixture (tests/fixtures/cproject: eight .c files, each compile sleeping 2 s first)
is built twice under one real dshd (real bwrap, default on_stop = "detach"): once undisturbed
(SLEEP=0), once while the test restarts the daemon three times -- SIGTERM + start, kill -9 +
start, SIGTERM + start -- each when make has printed a further pair of compile lines and the
binary does not exist yet (so each lands mid-build). The same `dsh run` rides through every
restart (it reconnects) and exits with make's 0; every line make printed arrives exactly once;
the two binaries are byte for byte the same (cmp), and `tool.wait` from a new client agrees.
The disturbed build's link waits for a file the test creates after the third restart (the
fixture's HOLD), so on a loaded machine, where a restart takes seconds, the compiles cannot
outrun the restarts: every restart lands before the binary exists.
"""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from dshd.testing import DshdProcess
from tests.ops.helpers import DSH, LIVENESS, Lines, copy_tree, dsh_env

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cproject"
OBJECTS = ["main", "parse", "table", "hash", "crc", "list", "fmt", "stats"]


@pytest.fixture
def daemon():
    root = Path(tempfile.mkdtemp(prefix="dshcp-"))
    d = DshdProcess(root)
    try:
        d.start()
        yield d
    finally:
        d.close()  # the daemon, then every call host under its state dir
        shutil.rmtree(root, ignore_errors=True)


def _build(daemon, project: Path, *make_args: str) -> subprocess.Popen:
    return subprocess.Popen([*DSH, "run", "--", "make", "-j2", *make_args], cwd=project,
                            env=dsh_env(daemon), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


def _compile_line(line: bytes) -> bool:
    return line.startswith(b"sleep ") and b" -c " in line


def test_make_j2_survives_three_restarts_and_builds_the_same_binary(daemon, tmp_path):
    quiet = copy_tree(FIXTURE, tmp_path / "quiet")
    undisturbed = _build(daemon, quiet, "SLEEP=0")
    out, err = undisturbed.communicate(timeout=LIVENESS)
    assert undisturbed.returncode == 0, (out, err)

    project = copy_tree(FIXTURE, tmp_path / "build")
    build = _build(daemon, project, "HOLD=release")
    lines = Lines(build)
    restarts = ["SIGTERM", "SIGKILL", "SIGTERM"]
    for n, how in enumerate(restarts, start=1):
        for _ in range(2):
            lines.until(_compile_line)
        assert not (project / "app").exists(), f"restart {n} came after the build ended"
        if how == "SIGKILL":
            daemon.kill9()
        else:
            assert daemon.stop() == 0, daemon.log_tail()
        daemon.start()
    (project / "release").touch()  # the link may run now
    rest = lines.rest()
    build.wait(LIVENESS)
    stderr = build.stderr.read().decode(errors="replace")
    assert build.returncode == 0, (build.returncode, stderr, lines.seen)

    printed = lines.seen
    compiles = [line for line in printed if _compile_line(line)]
    assert sorted(compiles) == sorted(set(compiles)) and len(compiles) == len(OBJECTS), printed
    for name in OBJECTS:
        assert sum(f" {name}.c ".encode() in line for line in compiles) == 1, printed
    assert any(line.startswith(b"cc -o app") for line in rest), rest
    assert filecmp.cmp(project / "app", quiet / "app", shallow=False)  # cmp: the same bytes
    assert subprocess.run([project / "app"], capture_output=True).stdout.strip().isdigit()

    sessions = json.loads(subprocess.run([*DSH, "sessions", "--json"], env=dsh_env(daemon),
                                         capture_output=True, text=True, timeout=60).stdout)
    sid = next(s["sessionId"] for s in sessions if s.get("cwd") == str(project))
    events = subprocess.run([*DSH, "log", sid, "--json"], env=dsh_env(daemon),
                            capture_output=True, text=True, timeout=60).stdout
    results = [json.loads(e)["data"] for e in events.splitlines()
               if json.loads(e)["type"] == "tool/result"]
    assert len(results) == 1 and results[0].get("exitCode") == 0, results
    assert not results[0].get("errorCode"), results
