"""The client resolves the socket and checks ids by the spec's rules on its own (it never
imports the daemon): it must agree with the daemon's own resolution (``dshd.paths``)."""

from __future__ import annotations

import pytest

from client.paths import is_valid_id, socket_path
from dshd import paths as daemon_paths


@pytest.mark.parametrize("env", [
    {},
    {"DSH_SOCKET": "/somewhere/d.sock"},
    {"XDG_RUNTIME_DIR": "/run/user/1234"},
    {"XDG_RUNTIME_DIR": "/run/user/1234", "DSH_SOCKET": "/x.sock"},
])
@pytest.mark.parametrize("explicit", [None, "", "/given.sock"])
def test_socket_path_agrees_with_the_daemon(monkeypatch, env, explicit):
    for name in ("DSH_SOCKET", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert socket_path(explicit) == daemon_paths.socket_path(explicit)


@pytest.mark.parametrize("value", ["c1", "a-b_C9", "x" * 64, "x" * 65, "", "a b", "a/b", "..",
                                   "__proto__", "constructor", "prototype", "é", None, 7])
def test_id_rule_agrees_with_the_daemon(value):
    assert is_valid_id(value) == daemon_paths.is_valid_id(value)
