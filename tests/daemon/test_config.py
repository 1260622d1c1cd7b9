"""Config: embedded defaults, TOML file, unknown keys named, flags win (issue 4 §4)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dshd.config import Config, ConfigError, load_config


def test_defaults_need_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no dsh/dshd.toml there
    c = load_config(None)
    assert c == Config()
    assert c.approval_policy == "ask" and c.sandbox == "workspace-write"
    assert c.max_message_bytes == 16 * 1024 * 1024 and c.output_max_bytes == 51_200


def test_file_then_flags(tmp_path):
    f = tmp_path / "dshd.toml"
    f.write_text('approval_policy = "never"\nsocket = "/tmp/from-file.sock"\noutput_max_lines = 10\n')
    c = load_config(f, socket="/tmp/from-flag.sock", state_dir=None)
    assert c.approval_policy == "never" and c.output_max_lines == 10
    assert c.socket == "/tmp/from-flag.sock"


def test_xdg_default_path_is_read(tmp_path, monkeypatch):
    (tmp_path / "dsh").mkdir()
    (tmp_path / "dsh" / "dshd.toml").write_text("network = true\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert load_config(None).network is True


@pytest.mark.parametrize(
    "text, needle",
    [
        ("approvl_policy = 'ask'\n", "approvl_policy"),
        ("sandbox = 'yolo'\n", "sandbox"),
        ("max_message_bytes = 'big'\n", "max_message_bytes"),
        ("this is not toml", "not valid TOML"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, text, needle):
    f = tmp_path / "dshd.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config(f)
    assert needle in str(exc.value) and str(f) in str(exc.value)


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_dshd_refuses_an_unknown_key_with_exit_2(tmp_path):
    f = tmp_path / "dshd.toml"
    f.write_text("colour = 'blue'\n")
    r = subprocess.run([sys.executable, "-m", "dshd", "--config", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "colour" in r.stderr
