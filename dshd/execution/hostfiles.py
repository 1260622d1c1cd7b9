"""The call directory's records, read by a daemon that did not start the host (HOST.md §3, §7).

Theory of operation: hosts outlive daemons, so a daemon at its start -- or a test fixture, or
``python -m dshd hosts`` with no daemon at all -- finds a call's host by its files alone and
must trust them only as far as it can check them. :func:`read_record` reads ``host.json`` and
``exit.json`` as small regular files of this uid (never a FIFO, a device or a symlink, never
past :data:`RECORD_MAX`); :func:`host_record` and :func:`record_on_disk` keep only well-formed
ones (the run's token is ``DSH_RUN`` with 32 hex digits, so a forged record cannot aim the
token sweep at other processes; exit codes and counts are bounded integers).
:func:`host_alive` says whether the record's host still runs: its pid alive with the same
``startTime`` in the same boot, as this uid, with ``callhost/main.py`` in its argv -- a reused
pid or a stranger is not alive, so it is never adopted or signalled. :func:`sweep_carriers`
kills what a dead host left of its command (the processes carrying its token);
:func:`end_host` ends a live host and its command without a daemon.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
from pathlib import Path

from dshd.callhost import tree

__all__ = ["END_HOST_SECONDS", "RECORD_MAX", "RUN_TOKEN_VAR", "end_host", "host_alive",
           "host_record", "read_record", "record_on_disk", "sweep_carriers"]

#: Largest ``host.json`` / ``exit.json`` read (each is a few hundred bytes).
RECORD_MAX = 65536
#: The environment variable that carries a run's kill-sweep token (HOST.md §4).
RUN_TOKEN_VAR = "DSH_RUN"
_INT_MAX = (1 << 53) - 1  # what JSON numbers carry exactly


def read_record(path: Path) -> dict | None:
    """A small JSON object file of a call dir, or None: never follows a symlink, never blocks
    on a FIFO or a device, never reads past :data:`RECORD_MAX`, and only trusts a regular file
    owned by this process's uid (the host writes both as the daemon's uid)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_size > RECORD_MAX
                or st.st_uid != os.geteuid()):
            return None
        data = os.read(fd, RECORD_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        value = json.loads(data) if len(data) <= RECORD_MAX else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _count(value: object, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _INT_MAX


def record_on_disk(directory: Path) -> dict | None:
    """The call's ``exit.json`` (HOST.md §3) when it is one: an exit code and signal that are
    small integers or null, and byte and line counts a log can have; anything else is no
    record (the call's outcome is then unknown, never an internal error)."""
    value = read_record(Path(directory) / "exit.json")
    if value is None:
        return None
    code, sig = value.get("exitCode"), value.get("signal")
    ok = (all(v is None or (isinstance(v, int) and not isinstance(v, bool)
                            and -(1 << 31) <= v < (1 << 31)) for v in (code, sig))
          and _count(value.get("totalBytes"), optional=True)
          and _count(value.get("totalLines"), optional=True)
          and _count(value.get("firstOffset"), optional=True)
          and int(value.get("firstOffset") or 0) <= int(value.get("totalBytes") or 0))
    return value if ok else None


#: Seconds :func:`end_host` gives a host to stop its command (TERM, the call's kill grace,
#: KILL) and exit before it SIGKILLs what is left.
END_HOST_SECONDS = 10.0


_TOKEN = re.compile(r"[0-9a-f]{32}")


def host_record(directory: Path) -> dict | None:
    """``host.json`` of a call dir (HOST.md §3), or None when missing, unreadable
    (:func:`read_record`) or not one a host writes: a positive pid, an integer start time, the
    run's token variable with a token of 32 hex digits, and integer uid and command pid when
    present -- what :func:`abandon` and :func:`end_host` would act on is never forged freely
    (the sweep only reaches processes that carry ``DSH_RUN=<that token>``)."""
    value = read_record(Path(directory) / "host.json")
    if value is None:
        return None
    pid, start_time = value.get("pid"), value.get("startTime")
    ok = (_count(pid) and pid > 0 and _count(start_time)
          and value.get("tokenVar", RUN_TOKEN_VAR) == RUN_TOKEN_VAR
          and isinstance(value.get("token", "0" * 32), str)
          and _TOKEN.fullmatch(value.get("token", "0" * 32)) is not None
          and _count(value.get("uid"), optional=True)
          and _count(value.get("commandPid"), optional=True))
    return value if ok else None


def _is_call_host(pid: int) -> bool:
    """``pid`` runs as this uid and is a call host (``.../callhost/main.py`` in its argv)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(65536).split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"/callhost/main.py") for arg in argv)


def host_alive(record: dict | None) -> bool:
    """The host ``record`` describes still runs: its pid is alive with the same ``startTime``
    (``/proc/PID/stat`` field 22) in the same boot (``bootId``, when the record has one), as
    this uid, and is a call host by its argv. A reused pid (another process now), a process of
    another user or one that is no call host is not alive, so it is never adopted or
    signalled."""
    if not record:
        return False
    pid, start_time = record.get("pid"), record.get("startTime")
    if not isinstance(pid, int) or pid <= 1 or not isinstance(start_time, int):
        return False
    boot = record.get("bootId")
    if boot is not None and boot != tree.boot_id():
        return False
    st = tree.proc_stat(pid)
    return st is not None and st.start_time == start_time and _is_call_host(pid)


def sweep_carriers(record: dict | None) -> int:
    """SIGKILL what is left of a dead host's command: the processes of the command's uid that
    carry the run's token (a host killed while no daemon ran leaves its orphans running
    unowned: its tree was never swept). No-op without a valid token; how many were hit."""
    if not record or not isinstance(record.get("token"), str):
        return 0
    uid = record.get("uid") if isinstance(record.get("uid"), int) else os.geteuid()
    return tree.kill_tree(-1, None, None, f"{RUN_TOKEN_VAR}={record['token']}", uid)


def _ask_to_end(directory: Path, record: dict, grace: float) -> bool:
    """Tell a live host, over its control socket, to terminate its command (reason
    ``cancelled``) and exit once its record is durable; False when it could not be told."""
    import socket

    dirfd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(f"/proc/self/fd/{dirfd}/{record.get('control', 'control.sock')}")
            lines = [{"hello": 1, "secret": record.get("secret", "")},
                     {"id": 1, "op": "terminate", "grace": grace, "reason": "cancelled"},
                     {"id": 2, "op": "release"}]
            sock.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
            got = b""
            while got.count(b"\n") < 3:
                data = sock.recv(65536)
                if not data:
                    break
                got += data
            return b'"hello"' in got
    except OSError:
        return False
    finally:
        os.close(dirfd)


def end_host(call_dir: Path, *, seconds: float = END_HOST_SECONDS) -> bool:
    """End the call host of ``call_dir`` and its command for good, without a daemon (test
    fixtures, ``python -m dshd hosts --cancel``): a live host (:func:`host_alive`) is asked
    to terminate its command (TERM, its kill grace, KILL; reason ``cancelled``, so its
    ``exit.json`` says so) and to exit; one that has not exited within ``seconds`` is
    SIGKILLed with its tree, as :func:`abandon` does. The run's token carriers are swept
    unless the host is gone and left its exit record (it swept them itself). True when a live host was found. Synchronous, bounded."""
    import time

    directory = Path(call_dir)
    record = host_record(directory)
    if record is None:
        return False
    alive = host_alive(record)
    pid = int(record["pid"]) if alive else -1  # -1 is nobody's parent: no tree to walk
    if alive:
        grace = record.get("killGrace")
        grace = float(grace) if isinstance(grace, (int, float)) else 2.0
        grace = min(grace, max(seconds / 2, 0.0))
        _ask_to_end(directory, record, grace)
        deadline = time.monotonic() + seconds
        while host_alive(record) and time.monotonic() < deadline:
            time.sleep(0.02)
    token, var = record.get("token"), record.get("tokenVar")
    marker = f"{var}={token}" if isinstance(token, str) and isinstance(var, str) else None
    leader = record.get("commandPid")
    uid = record.get("uid") if isinstance(record.get("uid"), int) else os.geteuid()
    spare = record.get("spareWrapper") if isinstance(record.get("spareWrapper"), str) else None
    if alive and host_alive(record):
        tree.kill_tree(pid, leader if isinstance(leader, int) else None, spare, marker, uid)
        if host_alive(record):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    elif marker is not None and record_on_disk(directory) is None:
        # A host that wrote its exit record swept its own tree at the end (HOST.md §5): only
        # one that died without it can have left token carriers behind.
        tree.kill_tree(-1, None, None, marker, uid)
    return alive
