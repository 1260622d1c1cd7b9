"""Config reload (issue 9 item 3): generic over the Config fields; a fixed set is refused by
name and keeps its value; the one shared Config changes in place, so holders see the change."""

from __future__ import annotations

import msgspec

from dshd.config import RELOAD_REFUSED, Config, ModelConfig, apply_reload, load_config


def _different(value):
    """A valid value different from ``value`` for each field type of Config."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2
    if isinstance(value, float):
        return value / 2 if value else 1.0
    if isinstance(value, ModelConfig):
        return msgspec.structs.replace(value, model="other-model")
    if value is None:
        return "/tmp/elsewhere"
    return None


def test_every_field_but_the_fixed_ones_is_reloadable():
    current = Config()
    holder = current  # what Registry, Session and Connection keep: the same object
    changes = {}
    for name in Config.__struct_fields__:
        new = _different(getattr(current, name))
        if new is not None:
            changes[name] = new
    changes["approval_policy"] = "never"
    changes["log_level"] = "warning"
    changes["sandbox_provider"] = "none"
    changes["group"] = "staff"
    new = msgspec.convert(msgspec.to_builtins(msgspec.structs.replace(current, **changes)), Config)
    result = apply_reload(current, new)
    assert set(result.refused) == set(changes) & RELOAD_REFUSED
    assert set(result.changed) == set(changes) - RELOAD_REFUSED
    assert {"socket", "state_dir", "system", "sandbox_provider"} <= set(result.refused)
    for name in changes:
        expected = getattr(Config(), name) if name in RELOAD_REFUSED else changes[name]
        assert getattr(holder, name) == expected, name
    assert holder.model.model == "other-model" and holder.max_sessions == 2048


def test_nothing_changed_is_an_empty_reload(tmp_path):
    f = tmp_path / "dshd.toml"
    f.write_text('max_sessions = 5\n[model]\nmax_steps = 3\n')
    current = load_config(f)
    result = apply_reload(current, load_config(f))
    assert result.changed == [] and result.refused == []
    f.write_text('max_sessions = 6\nsocket = "/tmp/x.sock"\n[model]\nmax_steps = 3\n')
    result = apply_reload(current, load_config(f))
    assert result.changed == ["max_sessions"] and result.refused == ["socket"]
    assert current.max_sessions == 6 and current.socket is None
