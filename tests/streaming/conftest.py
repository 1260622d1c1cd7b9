"""The daemon test level (``tests/daemon/conftest.py``) for the lane-pacing tests: a real
``Daemon`` over memory streams on the thread-aware autojump clock. The fixtures are that
level's, imported, not copied."""

from tests.daemon.conftest import (  # noqa: F401 - fixtures
    autojump, daemon, daemon_clock, daemon_overrides, model_script,
)
