"""What ``dsh run`` checks before it makes anything: its environment, timeout and command.

Theory of operation: every rule the daemon would apply to a call's arguments that can be
checked here is checked here, before any session is created, so that a refused request never
leaves an empty session behind (issue 15): the command is not empty and has no NUL, the
timeout is a finite number of seconds in ``(0, 7 days]`` (``inf`` and ``nan`` are not "no
timeout"), the environment passes ``protocol.methods.env_problem`` and ``Env``'s caps (the
rule of ``session.create``'s env and of bash's ``arguments.env``). A breach is a click usage
error (exit 2). The daemon checks all of it again (``dshd.tools.check_arguments``).

The environment of a call is only what ``--env-file FILE`` and ``--env KEY=VALUE`` say (later
``--env`` over earlier, every ``--env`` over the file): the client's own environment is never
passed. The file is read with python-dotenv's parser (``KEY=VALUE`` lines, ``#`` comments,
``export KEY=...``, single or double quotes) without interpolation (``${HOME}`` stays as
written: nothing of the client's environment leaks in); a line it cannot parse, or a name
without ``=VALUE``, is an error naming the line.
"""

from __future__ import annotations

import io
import math
import os
import re
from pathlib import Path

import click
import msgspec

from protocol import methods as m

__all__ = ["TIMEOUT", "call_env", "check_command", "current_dir", "ENV_RULE", "NAME_CHARS",
           "is_valid_name"]

#: A session name (PROTOCOL.md §3.1, ``session.create``'s ``name``; the daemon checks again).
NAME_CHARS = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_NAME = re.compile(NAME_CHARS)


def is_valid_name(value: str) -> bool:
    return _NAME.fullmatch(value) is not None

#: For ``--help``: where a call's environment comes from.
ENV_RULE = """\b
Environment: CMD gets dshd's documented minimal environment (PATH, locale,
HOME/USER of the session's owner), the session's env, and what --env-file
and --env give (--env last wins). The environment of this dsh is NOT passed:
`FOO=bar dsh run -- sh -c 'echo $FOO'` prints an empty line;
use `dsh run --env FOO=bar ...` (or --env FOO="$FOO")."""


class Timeout(click.ParamType):
    """Seconds: a finite number > 0 and at most bash's cap (7 days)."""

    name = "seconds"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        if isinstance(value, float):
            return value
        try:
            seconds = float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or not 0 < seconds <= m.MAX_BASH_TIMEOUT_SECONDS:
            self.fail(f"{value!r} is not a number of seconds > 0 and at most "
                      f"{m.MAX_BASH_TIMEOUT_SECONDS:g} (7 days); leave --timeout out for "
                      "no timeout", param, ctx)
        return seconds


TIMEOUT = Timeout()


def check_command(command: str) -> None:
    """A usage error for a command no shell can run (the daemon's rule, checked first)."""
    if not command.strip():
        raise click.UsageError("the command is empty: give one after `--` "
                               "(dsh run -- make test)")
    if "\0" in command:
        raise click.UsageError("the command contains a NUL character, which no shell can run")


def current_dir() -> str:
    """The working directory, or one clear error when it was deleted (or cannot be read)."""
    try:
        return os.getcwd()
    except OSError as exc:
        raise click.ClickException(
            f"the current directory cannot be used ({exc.strerror or exc}; was it deleted?): "
            "cd to an existing directory, or name a session with --session") from None


def _env_file(path: str) -> dict[str, str]:
    from dotenv.parser import parse_stream

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path!r}: {exc}", param_hint="--env-file")
    env: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        line = binding.original.line
        if binding.error:
            raise click.BadParameter(f"{path}:{line}: not a KEY=VALUE line", param_hint="--env-file")
        if binding.key is None:
            continue  # a blank line or a comment
        if binding.value is None:
            raise click.BadParameter(f"{path}:{line}: {binding.key!r} has no =VALUE "
                                     "(the client's environment is never passed)",
                                     param_hint="--env-file")
        env[binding.key] = binding.value
    return env


def call_env(pairs: tuple[str, ...], env_file: str | None) -> dict[str, str]:
    """The call's env from ``--env-file`` then ``--env`` (module doc); a usage error when it
    breaks the daemon's rule."""
    env = _env_file(env_file) if env_file else {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE (the client's environment is "
                                     "never passed: write --env KEY=\"$KEY\")", param_hint="--env")
        env[key] = value
    problem = m.env_problem(env, "the environment")
    if problem is None:
        try:
            msgspec.convert(env, m.Env)
        except msgspec.ValidationError as exc:
            problem = (f"the environment is too large ({exc}): at most {m.MAX_ENV_ENTRIES} "
                       f"names of <= {m.MAX_ENV_NAME_CHARS} chars, values of <= "
                       f"{m.MAX_ENV_VALUE_CHARS} chars")
    if problem is not None:
        raise click.BadParameter(problem, param_hint="--env/--env-file")
    return env
