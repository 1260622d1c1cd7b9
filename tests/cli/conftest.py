"""Fixtures of the CLI tests: the end-to-end daemon (a real ``dshd``, the real ``dsh``)."""

from tests.e2e.conftest import daemon, running_daemon, workdir  # noqa: F401 - fixtures
