"""Man pages and shell completion installed by `make install-user` / `make install-system`
(issue 15 item 6), for real, into a temporary HOME / prefix: `man -w dsh` and `man dsh` find
the page as the user would (no MANPATH for the user install: man derives
~/.local/share/man from ~/.local/bin on PATH; the system test points MANPATH at its MANDIR,
which stands in for /usr/local/share/man, always on man's path), the installed bash
completion completes through the installed dsh, and uninstall removes it all."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("man") is None,
                                reason="man is not installed (.ci/run installs man-db)")


def _make(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(REPO), "--no-print-directory", *args],
                          capture_output=True, text=True, timeout=900, env=env,
                          stdin=subprocess.DEVNULL)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.fixture
def short_dir():
    d = Path(tempfile.mkdtemp(prefix="dsh-man-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _user_env(home: Path) -> dict[str, str]:
    """A user whose HOME is ``home``: no XDG overrides, no MANPATH; PATH as a login shell
    gives it (~/.local/bin first) without per-user tool proxies that write into HOME."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XDG_", "MAN")) and k != "COLUMNS"}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if "/.cargo/" not in p + "/"]
    env.update(HOME=str(home), PATH=os.pathsep.join([str(home / ".local/bin"), *path]))
    return env


def _man(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["man", *args], capture_output=True, text=True, timeout=60,
                          env=dict(env, MANWIDTH="100", MANPAGER="cat", PAGER="cat"))


def _bash_completes(env: dict, script: Path, words: str) -> list[str]:
    """Source ``script`` as bash-completion's loader would and run its function on ``words``."""
    code = (f"source {script}; COMP_WORDS=({words}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); "
            "_dsh_completion dsh; printf '%s\\n' \"${COMPREPLY[@]}\"")
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", code], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def _fish_completes(env: dict, scratch: Path, line: str) -> list[str]:
    """A fresh fish (its config and cache kept out of HOME) asked to complete ``line``."""
    fish_env = dict(env, XDG_CONFIG_HOME=str(scratch / "fish-config"),
                    XDG_CACHE_HOME=str(scratch / "fish-cache"))
    r = subprocess.run(["fish", "--private", "-c", f"complete -C '{line}'"], capture_output=True,
                       text=True, timeout=60, env=fish_env)
    assert r.returncode == 0, r.stderr
    return [row.split("\t", 1)[0] for row in r.stdout.splitlines()]


def _check_pages(env: dict, mandir: Path) -> None:
    where = _man(env, "-w", "dsh")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()) == mandir / "man1" / "dsh.1"
    head = subprocess.run(["sh", "-c", "man dsh | head -5"], capture_output=True, text=True,
                          timeout=60, env=dict(env, MANWIDTH="100"))
    assert "dsh - run commands in dshd sessions that outlive the terminal." in head.stdout
    assert "dsh - dsh:" not in head.stdout  # the name is not repeated (issue 15 item 4)
    page = _man(env, "dsh").stdout
    assert "EXIT STATUS" in page and "TOOL_TIMEOUT" in page and "dsh-run(1)" in page
    run = _man(env, "dsh-run")
    assert run.returncode == 0 and "dsh run [OPTIONS] -- CMD..." in run.stdout
    assert (mandir / "man1" / "dsh-completion.1").is_file()


def test_install_user_puts_man_pages_and_completions_where_man_and_the_shells_look(short_dir):
    home = short_dir / "home"
    home.mkdir()
    before = _tree(home)
    env = _user_env(home)
    assert _man(env, "-w", "dsh").returncode != 0  # nothing before the install
    r = _make("install-user", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    data = home / ".local/share"
    _check_pages(env, data / "man")
    bash = data / "bash-completion/completions/dsh"
    assert _bash_completes(env, bash, "dsh he") == ["help"]
    assert "--timeout" in _bash_completes(env, bash, "dsh run --ti")
    assert (data / "zsh/site-functions/_dsh").read_text().startswith("#compdef dsh")
    assert "complete --no-files --command dsh" in (
        data / "fish/vendor_completions.d/dsh.fish").read_text()
    if shutil.which("fish"):  # fish loads it by itself from its vendor directory
        assert _fish_completes(env, short_dir, "dsh he") == ["help"]
    r = _make("uninstall-user", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _tree(home) == before
    assert _man(env, "-w", "dsh").returncode != 0


@pytest.mark.skipif(os.getuid() != 0, reason="install-system needs root")
def test_install_system_puts_man_pages_and_completions_under_its_dirs(short_dir):
    share = short_dir / "share"
    locs = [f"PREFIX={short_dir / 'opt'}", f"UNITDIR={short_dir / 'units'}",
            f"DOCDIR={short_dir / 'doc'}", f"MANDIR={share / 'man'}",
            f"BASH_COMPLETION_DIR={share / 'bash-completion/completions'}",
            f"ZSH_COMPLETION_DIR={share / 'zsh/site-functions'}",
            f"FISH_COMPLETION_DIR={share / 'fish/vendor_completions.d'}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAN")}
    r = _make("install-system", *locs, env=env)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        venv_bin = short_dir / "opt/venv/bin"
        user = dict(env, MANPATH=str(share / "man"),
                    PATH=os.pathsep.join([str(venv_bin), env.get("PATH", "")]))
        _check_pages(user, share / "man")
        assert _bash_completes(user, share / "bash-completion/completions/dsh",
                               "dsh comp") == ["completion"]
        assert (share / "zsh/site-functions/_dsh").is_file()
        assert (share / "fish/vendor_completions.d/dsh.fish").is_file()
    finally:
        r = _make("uninstall-system", *locs, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not share.exists() or _tree(share) == set()
