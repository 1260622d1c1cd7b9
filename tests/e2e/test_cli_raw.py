"""``dsh run``, ``dsh attach`` and ``dsh wait`` over the raw channel against a real dshd:
byte-exact output at every size (``cmp``), carriage returns intact, stdin forwarded, the
complete replay of a call attached late (from byte 0, or its last ``--tail`` lines), and the
complete output of a settled call from ``dsh wait``."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import running_daemon

SEQ = "".join(f"{i}\n" for i in range(1, 100_001)).encode()


@pytest.fixture(scope="module")
def dshd():
    with running_daemon(prefix="dsh-raw-") as d:
        yield d


def dsh_line(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in [sys.executable, "-m", "client.cli", *args])


def run(dshd, *args: str, stdin=subprocess.DEVNULL, cwd=None, timeout=300,
        shell: str | None = None) -> subprocess.CompletedProcess:
    cmd = ["sh", "-c", shell] if shell else [sys.executable, "-m", "client.cli", *args]
    return subprocess.run(cmd, env=dshd.env, cwd=cwd, capture_output=True, timeout=timeout,
                          stdin=stdin)


def feed(dshd, data: bytes, *args: str) -> subprocess.CompletedProcess:
    """``dsh ARGS`` with ``data`` on a pipe as its stdin (closed after it)."""
    return subprocess.run([sys.executable, "-m", "client.cli", *args], env=dshd.env,
                          input=data, capture_output=True, timeout=300)


def ids(stderr: bytes) -> tuple[str, str]:
    words = stderr.decode().splitlines()[0].split()
    assert words[0] == "session" and words[2] == "call", stderr
    return words[1], words[3]


@pytest.mark.parametrize("size", [0, 1, 4096, 51199, 51200, 51201, 1 << 20, 100 << 20])
def test_run_prints_random_bytes_byte_exact(dshd, tmp_path, size):
    data = os.urandom(size)
    src = tmp_path / "random.bin"
    src.write_bytes(data)
    r = run(dshd, shell=f"{dsh_line('run', '--', 'cat', str(src))} | cmp - {shlex.quote(str(src))}"
            " && echo SAME", cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == b"SAME\n", r.stderr[-2000:]


def test_carriage_returns_come_out_intact(dshd, tmp_path):
    r = run(dshd, "run", "--", "printf", "1%%\\r2%%\\r3%%\\n", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"1%\r2%\r3%\n"


def test_stdin_is_forwarded_when_it_is_not_a_terminal(dshd, tmp_path):
    r = run(dshd, shell=f"echo hi | {dsh_line('run', '--', 'cat')}", cwd=str(tmp_path))
    assert (r.returncode, r.stdout) == (0, b"hi\n"), r.stderr
    big = os.urandom(3 * (1 << 20) + 17)  # several tool.write chunks
    r = feed(dshd, big, "run", "--", "sh", "-c", "wc -c")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(len(big)).encode()


def test_devnull_or_closed_stdin_breaks_nothing(dshd, tmp_path):
    r = run(dshd, "run", "--", "sh", "-c", "cat; echo end")
    assert (r.returncode, r.stdout) == (0, b"end\n"), r.stderr
    r = run(dshd, shell=f"{dsh_line('run', '--', 'sh', '-c', 'cat; echo end')} <&-")
    assert (r.returncode, r.stdout) == (0, b"end\n"), r.stderr


def test_a_command_reading_stdin_gets_eof_when_stdin_is_a_closed_pipe(dshd, tmp_path):
    r = feed(dshd, b"", "run", "--", "sh", "-c", "read x || echo got-eof")
    assert (r.returncode, r.stdout) == (0, b"got-eof\n"), r.stderr


def _seq_call(dshd, tmp_path, tail: str = "") -> tuple[str, str, subprocess.Popen]:
    """``seq 1 100000`` then (while ``go`` is missing) keep running; (session, call, dsh)."""
    script = f"seq 1 100000; {tail}"
    proc = subprocess.Popen([sys.executable, "-m", "client.cli", "run", "--", "sh", "-c",
                             script], env=dshd.env, cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    session_id, call_id = ids(proc.stderr.readline())
    return session_id, call_id, proc


def _wait_output(dshd, session_id: str, call_id: str, size: int) -> None:
    """Until the call's raw log holds ``size`` bytes (liveness bound)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        path = dshd.state_dir / "sessions" / session_id / "calls" / call_id / "output.raw"
        if path.exists() and path.stat().st_size >= size:
            return
        time.sleep(0.1)
    raise AssertionError("the call's output did not reach its size")


def test_attach_after_a_finished_call_replays_everything(dshd, tmp_path):
    session_id, call_id, proc = _seq_call(dshd, tmp_path)
    assert proc.wait(timeout=120) == 0
    r = run(dshd, "attach", session_id, "--call", call_id)
    assert r.returncode == 0, r.stderr
    assert r.stdout == SEQ


def test_attach_to_a_running_call_replays_from_byte_0_then_follows(dshd, tmp_path):
    session_id, call_id, proc = _seq_call(
        dshd, tmp_path, "while [ ! -e go ]; do sleep 0.05; done; echo END")
    try:
        _wait_output(dshd, session_id, call_id, len(SEQ))
        attach = subprocess.Popen([sys.executable, "-m", "client.cli", "attach", session_id],
                                  env=dshd.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = attach.stdout.read(len(SEQ))
        assert first == SEQ
        (tmp_path / "go").touch()
        rest, err = attach.communicate(timeout=120)
        assert attach.returncode == 0, err
        assert rest == b"END\n"
    finally:
        (tmp_path / "go").touch()
        proc.wait(timeout=120)


def test_attach_tail_shows_the_last_lines(dshd, tmp_path):
    session_id, call_id, proc = _seq_call(dshd, tmp_path)
    assert proc.wait(timeout=120) == 0
    r = run(dshd, "attach", session_id, "--call", call_id, "--tail", "5")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"99996\n99997\n99998\n99999\n100000\n"


def test_wait_prints_the_complete_output_of_a_settled_call(dshd, tmp_path):
    session_id, call_id, proc = _seq_call(dshd, tmp_path)
    assert proc.wait(timeout=120) == 0
    r = run(dshd, "wait", session_id, call_id)
    assert r.returncode == 0, r.stderr
    assert r.stdout == SEQ
    assert b"not shown" not in r.stderr and b"window" not in r.stderr
    result = json.loads(run(dshd, "wait", session_id, call_id, "--json").stdout)
    assert result["details"]["truncation"]["totalBytes"] == len(SEQ)


def test_attach_says_in_one_line_what_the_disk_cap_dropped(tmp_path):
    with running_daemon("spill_max_bytes = 65536\n", prefix="dsh-raw-cap-") as capped:
        session_id, call_id, proc = _seq_call(capped, tmp_path)
        assert proc.wait(timeout=120) == 0
        r = run(capped, "attach", session_id, "--call", call_id)
        assert r.returncode == 0, r.stderr
        dropped = len(SEQ) - len(r.stdout)
        assert 0 < dropped and r.stdout == SEQ[dropped:]  # the retained end, byte for byte
        lines = [line for line in r.stderr.decode().splitlines() if "disk cap" in line]
        assert lines == [f"dsh: bytes 0..{dropped} of the output were dropped by the per-call "
                         f"disk cap (spill_max_bytes); the output goes on from byte {dropped}"]
        r = run(capped, "attach", session_id, "--call", call_id, "--tail", "100000")
        assert r.stdout == SEQ[dropped:]
        assert "dsh: the per-call disk cap (spill_max_bytes) dropped the first " \
               f"{dropped} bytes" in r.stderr.decode()
        r = run(capped, "wait", session_id, call_id)
        assert r.stdout == SEQ[dropped:] and b"disk cap" in r.stderr
