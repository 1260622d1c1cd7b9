"""The host's spec (HOST.md §2) and its small JSON files (HOST.md §3).

Theory of operation: the runner writes one JSON spec (version 1) to the host's stdin.
:func:`validate` checks every field's type and range and returns the spec with defaults
filled in, or raises :class:`SpecError` with a sentence the runner passes on (the host then
answers ``{"ok": false, "error": ...}`` and starts nothing). :func:`write_json` writes a file
atomically (temp + rename in the same directory), and durably when asked (fsync of the file
before the rename and of the directory after it): ``exit.json`` is durable, ``host.json``
only atomic (it describes a live host; after a power loss there is none).
"""

from __future__ import annotations

import json
import math
import os
import stat

__all__ = ["SPEC_MAX", "SpecError", "validate", "write_json"]

#: Largest spec accepted (bytes): argv and env of a command, bounded.
SPEC_MAX = 8 * 1_048_576
_SECONDS_MAX = 366 * 86400.0


class SpecError(ValueError):
    """A spec the host cannot use."""


def _need(ok: bool, sentence: str) -> None:
    if not ok:
        raise SpecError(sentence)


def _is_int(value, low: int = 0, high: int = 1 << 62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _seconds(spec: dict, key: str, default, allow_none: bool = False):
    value = spec.get(key, default)
    if value is None and allow_none:
        return None
    _need(isinstance(value, (int, float)) and not isinstance(value, bool)
          and not math.isnan(value) and 0 <= value <= _SECONDS_MAX,
          f"spec field {key} must be a number of seconds from 0 to {_SECONDS_MAX:.0f}")
    return float(value)


def _check_strings(spec: dict) -> None:
    argv = spec.get("argv")
    _need(isinstance(argv, list) and argv and all(isinstance(a, str) and "\0" not in a
                                                  for a in argv),
          "spec field argv must be a non-empty list of strings without NUL")
    _need(isinstance(spec.get("cwd"), str) and spec["cwd"].startswith("/"),
          "spec field cwd must be an absolute path")
    env = spec.get("env")
    _need(isinstance(env, dict) and all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k
        and "\0" not in k + v for k, v in env.items()),
        "spec field env must map names (no '=' or NUL) to strings")
    for key in ("token_var", "token", "secret"):
        value = spec.get(key)
        _need(isinstance(value, str) and value and "=" not in value and "\0" not in value
              and len(value) <= 256, f"spec field {key} must be a short non-empty string")


def _check_identity(spec: dict) -> None:
    user = spec.get("user")
    _need(user is None or (isinstance(user, dict) and _is_int(user.get("uid"), 0, 2**32 - 2)
                           and _is_int(user.get("gid"), 0, 2**32 - 2)
                           and isinstance(user.get("groups", []), list)
                           and all(_is_int(g, 0, 2**32 - 2) for g in user.get("groups", []))
                           and len(user.get("groups", [])) <= 65536),
          "spec field user must be null or {uid, gid, groups}")
    tty = spec.get("tty")
    _need(tty is None or (isinstance(tty, dict) and _is_int(tty.get("cols"), 1, 10000)
                          and _is_int(tty.get("rows"), 1, 10000)
                          and isinstance(tty.get("term", "xterm-256color"), str)),
          "spec field tty must be null or {cols, rows (1..10000), term}")
    _need(spec.get("stdin", "null") in ("null", "pipe"), 'spec field stdin must be "null" or "pipe"')
    fds = spec.get("pass_fds", [])
    _need(isinstance(fds, list) and len(fds) <= 64 and all(_is_int(fd, 3, 1 << 20) for fd in fds),
          "spec field pass_fds must be a list of fds >= 3")
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:
            raise SpecError(f"spec field pass_fds names fd {fd}, which the host did not "
                            "inherit") from None
    _need(spec.get("spare_wrapper") is None or isinstance(spec["spare_wrapper"], str),
          "spec field spare_wrapper must be null or a process name")


def validate(spec) -> dict:
    """The spec with defaults filled in; raises :class:`SpecError` (see the module doc)."""
    _need(isinstance(spec, dict), "the spec must be a JSON object")
    _need(spec.get("version") == 1, "spec version must be 1 (this host speaks version 1)")
    directory = spec.get("dir")
    _need(isinstance(directory, str) and directory.startswith("/"),
          "spec field dir must be an absolute path")
    try:
        st = os.stat(directory)
    except OSError as exc:
        raise SpecError(f"the call directory {directory} is not usable ({exc.strerror})") from None
    _need(stat.S_ISDIR(st.st_mode), f"the call directory {directory} is not a directory")
    _need(st.st_uid == os.geteuid() and not st.st_mode & 0o077,
          f"the call directory {directory} must be owned by the host's user and mode 0700")
    _check_strings(spec)
    _check_identity(spec)
    spill, segment = spec.get("spill_max_bytes"), spec.get("segment_bytes")
    _need(_is_int(spill, 4096) and _is_int(segment, 1) and segment * 4 <= spill,
          "spec fields spill_max_bytes and segment_bytes must be integers with "
          "4 * segment_bytes <= spill_max_bytes")
    out = dict(spec)
    out["stdin"] = spec.get("stdin", "null")
    if spec.get("tty") is not None:
        out["tty"] = {"term": "xterm-256color", **spec["tty"]}
        out["stdin"] = "pipe"  # a PTY always has input
    else:
        out["tty"] = None
    out["user"] = None if spec.get("user") is None else {"groups": [], **spec["user"]}
    out["pass_fds"] = list(spec.get("pass_fds", []))
    out["spare_wrapper"] = spec.get("spare_wrapper")
    out["timeout"] = _seconds(spec, "timeout", None, allow_none=True)
    out["on_daemon_loss"] = spec.get("on_daemon_loss", "terminate")
    out["attach_seconds"] = _seconds(spec, "attach_seconds", 30.0)
    _need(out["on_daemon_loss"] in ("terminate", "keep"),
          'spec field on_daemon_loss must be "terminate" or "keep"')
    out["daemon"] = spec.get("daemon", {})
    _need(isinstance(out["daemon"], dict),
          "spec field daemon must be an object (the daemon's own notes, kept in host.json)")
    for key, default in (("kill_grace", 2.0), ("eof_grace", 2.0), ("linger", 300.0)):
        out[key] = _seconds(spec, key, default)
    return out


def write_json(directory: str, name: str, obj: dict, durable: bool) -> None:
    """Write ``directory/name`` atomically (and durably: see the module doc)."""
    tmp = os.path.join(directory, f".{name}.tmp")
    data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(directory, name))
    if durable:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
