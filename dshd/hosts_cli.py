"""``python -m dshd hosts``: the call hosts alive under a state directory (HOST.md §7).

Theory of operation: since a daemon stop leaves running calls in their call hosts
(``on_stop = "detach"``), an operator needs to see what still runs, and to end it without a
daemon (``make clean CANCEL=1``). This command scans ``sessions/*/calls/*/host.json`` (no
log is read to find them; at most :data:`MAX_HOSTS` are listed) and counts a host as alive
only when ``/proc/PID/stat`` has the same start time (field 22) as ``host.json``'s
``startTime`` (``hostlink.host_alive``): a pid that was reused by another process is not a
host and is never signalled.
For each live host it prints the session, the call, the pid, the age (from the start time and
the boot time), the state (``running``, or ``ended`` once ``exit.json`` is written and the
host only waits to be released) and the command (the call's ``tool/call`` arguments: a live
host's call has no ``tool/result``, so it is one of the log's open calls, read from the last
snapshot on -- never the whole log, unless it has no snapshot yet; the log is only read; a
host whose call was settled just before the daemon stopped shows ``?``).

``--cancel`` ends every live host with :func:`dshd.execution.hostlink.end_host` (TERM to the
command's tree, a grace, then KILL, the host last). It refuses while a dshd holds the state
directory: that daemon owns the calls (``dsh cancel SESSION CALL`` records their result; an
external kill would settle them as a dead host). Output: one tab-separated line per host on
stdout, or one JSON array with ``--json``; a summary on stderr. Exit status: 0, 1 when the
state directory does not exist, ``--cancel`` is refused or a host would not end, 2 for a
usage error, 141 when stdout is a closed pipe (``--cancel`` still ends the hosts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from protocol.printable import printable

from .execution.hostlink import end_host, host_alive, host_record
from .paths import is_valid_id, state_dir as resolve_state_dir
from .storage.errors import StorageError
from .storage.fsck import daemon_holds
from .storage.pages import open_read
from .storage.reader import find_log, parse_log
from .storage.summary import summary_snapshot_offset
from .storage.repair import RepairState

__all__ = ["HostInfo", "live_hosts", "main"]

#: Most hosts listed (and cancelled) in one run; a state dir holds at most max_calls running.
MAX_HOSTS = 65_536
#: Exit status when stdout was closed (a broken pipe), as the other commands.
EXIT_BROKEN_PIPE = 141
#: Longest command shown in the human listing (the JSON has it whole).
SHOWN_COMMAND = 120


@dataclass
class HostInfo:
    """One live call host: where it is and what it runs."""

    sessionId: str
    callId: str
    pid: int
    startTime: int
    ageSeconds: float
    state: str  # "running" | "ended"
    command: str | None
    dir: str


def _boot_time() -> float:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    return 0.0


def _read_all(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size, 0)


def _open_calls(session_dir: Path, session_id: str) -> dict[str, dict]:
    """callId -> the ``tool/call`` data of each call without a ``tool/result``, read from the
    log's last snapshot on (``storage.pages.open_read``: the read an open does, the summary's
    ``snapshotOffset`` as its fallback, without the write; the whole log only when it has no
    snapshot)."""
    path, compression = find_log(session_dir, session_id)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        read = open_read(fd, session_id, path, compression, _read_all, parse_log,
                         summary_snapshot_offset(session_dir, session_id))
    finally:
        os.close(fd)
    repair = read.repair if read.repair is not None else RepairState().see_all(read.events)
    return {cid: call["data"] for cid, call in repair.open_calls.items()}


def _commands(session_dir: Path, session_id: str) -> dict[str, str]:
    """callId -> command of the session's unsettled calls (a live host's call has no result;
    read only; {} if unreadable)."""
    try:
        calls = _open_calls(session_dir, session_id)
    except (OSError, ValueError, StorageError):  # a damaged log still lists its hosts
        return {}
    out = {}
    for cid, data in calls.items():
        arguments = data.get("arguments")  # the arguments' JSON text (STORAGE.md §3)
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                continue
        command = arguments.get("command") if isinstance(arguments, dict) else None
        if isinstance(command, str):
            out[cid] = command
    return out


def _call_dirs(root: Path):
    sessions = root / "sessions"
    for session_dir in sorted(sessions.iterdir()) if sessions.is_dir() else []:
        calls = session_dir / "calls"
        if is_valid_id(session_dir.name) and calls.is_dir():
            for call_dir in sorted(calls.iterdir()):
                yield session_dir, call_dir


def live_hosts(root: Path, limit: int = MAX_HOSTS) -> list[HostInfo]:
    """Every live call host under the state directory ``root`` (at most ``limit``)."""
    hz = os.sysconf("SC_CLK_TCK")
    boot, now = _boot_time(), time.time()
    found: list[HostInfo] = []
    commands: dict[str, dict[str, str]] = {}
    for session_dir, call_dir in _call_dirs(root):
        record = host_record(call_dir)
        if not host_alive(record):
            continue
        sid = session_dir.name
        if sid not in commands:
            commands[sid] = _commands(session_dir, sid)
        state = "ended" if (call_dir / "exit.json").exists() else "running"
        found.append(HostInfo(sid, call_dir.name, record["pid"], record["startTime"],
                              round(max(0.0, now - (boot + record["startTime"] / hz)), 1),
                              state, commands[sid].get(call_dir.name), str(call_dir)))
        if len(found) >= limit:
            break
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dshd hosts",
        description="List the call hosts that run under a state directory (tool calls that "
        "outlived a daemon stop, or that a running dshd owns); --cancel ends them.")
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help="the state directory (default: $DSH_STATE_DIR, else the user's)")
    parser.add_argument("--json", action="store_true", help="print the hosts as one JSON array")
    parser.add_argument("--cancel", action="store_true",
                        help="end every listed host (TERM, grace, KILL); refused while a dshd "
                        "holds the state directory")
    return parser


def _line(host: HostInfo) -> str:
    command = host.command if host.command is not None else "?"
    if len(command) > SHOWN_COMMAND:
        command = command[:SHOWN_COMMAND] + "…"
    return "\t".join([host.sessionId, host.callId, str(host.pid), f"{host.ageSeconds:.0f}s",
                      host.state, printable(command)])


def _cancel(hosts: list[HostInfo]) -> int:
    failed = [h for h in hosts if not end_host(Path(h.dir))]
    for h in failed:
        print(f"dsh: the call host of {h.sessionId}/{h.callId} (pid {h.pid}) did not end",
              file=sys.stderr)
    print(f"dsh: ended {len(hosts) - len(failed)} of {len(hosts)} call host"
          f"{'' if len(hosts) == 1 else 's'}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (without the ``hosts`` word); returns the exit status."""
    args = _parser().parse_args(argv)
    root = resolve_state_dir(args.state_dir)
    if not root.is_dir():
        print(f"dsh: no state directory {root}", file=sys.stderr)
        return 1
    hosts = live_hosts(root)
    try:
        if args.json:
            print(json.dumps([asdict(h) for h in hosts], ensure_ascii=False), flush=True)
        else:
            for host in hosts:
                print(_line(host))
            sys.stdout.flush()
    except BrokenPipeError:  # `dshd hosts | head`: stdout closed; what follows still runs
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if not args.cancel:
            return EXIT_BROKEN_PIPE
    if not args.cancel:
        print(f"dsh: {len(hosts)} call host{'' if len(hosts) == 1 else 's'} alive under {root}",
              file=sys.stderr)
        return 0
    if daemon_holds(root):
        print(f"dsh: a running dshd holds {root} and owns these calls: stop it first (make "
              "stop), or cancel each with `dsh cancel SESSION CALL`", file=sys.stderr)
        return 1
    return _cancel(hosts)
