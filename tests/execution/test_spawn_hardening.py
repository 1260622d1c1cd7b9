"""Spawn hardening pieces that a daemon test cannot reach on demand (issue 10 items 7, 20)."""

from __future__ import annotations

import errno
import os
import subprocess

from dshd.execution.spawn import INLINE_COMMAND_MAX, BashScript, spawn_sentence


def test_a_fork_at_a_resource_limit_names_the_limit():
    sentence = spawn_sentence(["bwrap"], "/", BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN)))
    assert "could not start a thread/process: resource limit" in sentence
    assert "EAGAIN" in sentence and "program exists" not in sentence


def test_a_long_script_goes_through_a_sealed_memfd(tmp_path):
    command = "echo " + "x" * (INLINE_COMMAND_MAX + 1) + " > out"
    script = BashScript(command)
    try:
        assert script.pass_fds and script.argv[-1] == f"/dev/fd/{script.fd}"
        try:
            with open(f"/proc/self/fd/{script.fd}", "r+b", buffering=0) as f:
                f.write(b"tampered")
            written = True
        except PermissionError:
            written = False
        assert not written  # sealed: the command cannot be changed after the audit pair
        subprocess.run(script.argv, cwd=tmp_path, pass_fds=script.pass_fds, check=True)
    finally:
        script.close()
    assert (tmp_path / "out").read_text() == "x" * (INLINE_COMMAND_MAX + 1) + "\n"
    assert script.fd is None


def test_a_short_script_stays_bash_c():
    script = BashScript("echo hi")
    assert script.argv[1:] == ["-c", "--", "echo hi"] and script.pass_fds == ()
