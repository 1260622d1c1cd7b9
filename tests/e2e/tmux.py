"""A real terminal for the CLI's tty tests: one tmux server per test, driven like a person.

``Pane`` starts ``tmux -L <unique> -f /dev/null new-session -d -x COLS -y ROWS sh`` (status
line off, so the pane is the whole window) with ``dsh`` on its PATH (a wrapper that runs this
checkout's ``python -m client.cli``) and ``DSH_SOCKET`` set; ``type`` sends keys (tmux
``send-keys``), ``screen`` is ``capture-pane -p``, ``until`` polls the screen for a pattern
with a generous liveness bound (never a timing assertion). ``run`` types a command line that
ends by printing ``DONE<n>-<status>`` so a test can wait for the command to finish and read its
exit status off the screen.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a test waits for the screen to show something (liveness, not speed).
LIVENESS_S = 60.0


def have_tmux() -> bool:
    return shutil.which("tmux") is not None


class Pane:
    def __init__(self, tmp: Path, socket_path: str, cwd: Path, cols: int = 120,
                 rows: int = 40) -> None:
        self.name = "dsh-" + secrets.token_hex(6)
        self.runs = 0
        self.tmp = tmp
        bindir = tmp / "bin"
        bindir.mkdir(exist_ok=True)
        wrapper = bindir / "dsh"
        wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m client.cli \"$@\"\n")
        wrapper.chmod(0o755)
        self.env = dict(os.environ, DSH_SOCKET=str(socket_path), PYTHONPATH=str(ROOT),
                        PATH=f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                        PS1="$ ", ENV="", HOME=str(tmp))
        self.env.pop("TMUX", None)
        # A terminal program takes $COLUMNS/$LINES over the pane's real size (shutil, Textual):
        # a test run that exports them (some runners do) must not shrink the pane's programs.
        self.env.pop("COLUMNS", None)
        self.env.pop("LINES", None)
        self._tmux("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(cols),
                   "-y", str(rows), "-c", str(cwd), "sh")
        self._tmux("set-option", "-g", "status", "off")
        self._tmux("set-option", "-g", "window-size", "manual")
        self.resize(cols, rows)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.name, *args], env=self.env,
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def type(self, *keys: str, literal: bool = False) -> None:
        self._tmux("send-keys", "-t", "t", *(["-l"] if literal else []), *keys)

    def line(self, text: str) -> None:
        """Type ``text`` and Enter."""
        self.type(text, literal=True)
        self.type("Enter")

    def run(self, command: str) -> str:
        """Type ``command`` so that it prints ``<mark>-<status>`` when it ends; the mark."""
        self.runs += 1
        mark = f"DONE{self.runs}"
        self.line(f"{command}; echo {mark}-$?")
        return mark

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t", "-S", "-2000")

    def size(self) -> tuple[int, int]:
        cols, rows = self._tmux("display-message", "-p", "-t", "t",
                                "#{pane_width} #{pane_height}").split()
        return int(cols), int(rows)

    def display(self, fmt: str) -> str:
        """A tmux format of the pane (``#{alternate_on}``, ``#{cursor_flag}``...)."""
        return self._tmux("display-message", "-p", "-t", "t", fmt).strip()

    def resize(self, cols: int, rows: int) -> None:
        self._tmux("resize-window", "-t", "t", "-x", str(cols), "-y", str(rows))

    def until(self, pattern: str, timeout: float = LIVENESS_S) -> re.Match:
        """Poll the screen until ``pattern`` (a regex) shows; the match."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            found = re.search(pattern, text, re.M)
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} did not show within {timeout:g} s; "
                                     f"the screen:\n{text}")
            time.sleep(0.1)

    def done(self, mark: str, timeout: float = LIVENESS_S) -> int:
        """Wait until the command of ``mark`` (``run``) ended; its exit status."""
        return int(self.until(rf"^{mark}-(\d+)", timeout).group(1))

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], env=self.env,
                       capture_output=True, timeout=30)
