"""Finding and signalling the command's processes, by ``/proc`` and pidfd (HOST.md §4).

Theory of operation: the host is the command's parent and, through ``PR_SET_CHILD_SUBREAPER``,
the parent of every orphan the command leaves (a double-forked or ``setsid`` child is
re-parented to the host, not to pid 1). So "the command's tree" is every process whose
``/proc`` parent chain leads to the host (:func:`descendants`). The command runs as the
leader of its own session and process group (``setsid`` or ``login_tty``), whose id is the
command's pid. Three operations:

* :func:`signal_command` -- a signal to *the command*: the group's live members
  (:func:`command_pids`) minus the sandbox wrapper's own processes. bwrap with a pid namespace
  is an outer process (the group leader) and an inner pid 1 (its child, same ``comm``); a TERM
  or INT to them tears the sandbox down before the command's ``trap`` runs and its exit code
  never comes back, so they are spared; bwrap exits with the command's status.
* :func:`kill_tree` -- SIGKILL to every descendant of the host other than the wrapper's own,
  then to every process of the call's uid whose environment carries the run's token
  (``DSH_RUN=<token>``: a process that escaped the tree, e.g. handed to another parent), then
  to the wrapper itself (under bwrap the pid namespace goes down with its pid 1 anyway).
* :func:`proc_stat` -- the parsed ``/proc/PID/stat`` every check uses.

Against pid reuse, every single signal goes through a pidfd opened first, and is sent only if,
with the pidfd held, the process is still the one the scan found: the same start time (field
22) and, for the group and token paths, still in the group / still carrying the token. A pid
that exited and was reused between the scan and the kill is never hit. Pure ``/proc`` and
``os``; synchronous and quick.
"""

from __future__ import annotations

import os
import signal

__all__ = ["ProcStat", "command_pids", "descendants", "kill_tree", "proc_stat",
           "signal_command"]


class ProcStat:
    """What the checks need of ``/proc/PID/stat``: parent, group, name, start time."""

    __slots__ = ("comm", "pgid", "ppid", "start_time")

    def __init__(self, ppid: int, pgid: int, comm: str, start_time: int) -> None:
        self.ppid, self.pgid, self.comm, self.start_time = ppid, pgid, comm, start_time


def boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``): a pid and start time recorded in
    an earlier boot name nobody's process now."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None


def proc_stat(pid: int | str) -> ProcStat | None:
    """The stat of a live (not zombie) process; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    head, _, tail = raw.rpartition(b")")
    fields = tail.split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    comm = head.partition(b"(")[2].decode(errors="replace")
    # fields[0] is field 3 (state); field 22 (starttime) is fields[19].
    return ProcStat(int(fields[1]), int(fields[2]), comm, int(fields[19]))


def _all_stats() -> dict[int, ProcStat]:
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(name)
            if st is not None:
                stats[int(name)] = st
    return stats


def descendants(root: int) -> dict[int, ProcStat]:
    """Every live process whose parent chain leads to ``root`` (not ``root`` itself)."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st.ppid, []).append(pid)
    found: dict[int, ProcStat] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in found or pid == root:
            continue
        found[pid] = stats[pid]
        todo.extend(children.get(pid, ()))
    return found


def _wrapper_pids(leader: int, stats: dict[int, ProcStat], spare_wrapper: str | None) -> set[int]:
    """The wrapper's own processes: the leader and its children of the wrapper's name, when the
    leader has that name."""
    st = stats.get(leader)
    if spare_wrapper is None or st is None or st.comm != spare_wrapper:
        return set()
    return {leader} | {p for p, s in stats.items() if s.ppid == leader and s.comm == spare_wrapper}


def command_pids(pgid: int, spare_wrapper: str | None) -> dict[int, ProcStat]:
    """Live members of group ``pgid`` minus the wrapper's own processes (see the module doc)."""
    stats = _all_stats()
    members = {p: s for p, s in stats.items() if s.pgid == pgid}
    spare = _wrapper_pids(pgid, stats, spare_wrapper)
    return {p: s for p, s in members.items() if p not in spare}


def _carries(pid: int, needle: bytes, uid: int) -> bool:
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return False
    return b"\0" + needle + b"\0" in b"\0" + environ.rstrip(b"\0") + b"\0"


def _send(pid: int, sig: int, still: "callable") -> bool:
    """Signal ``pid`` through a pidfd if ``still(pid)`` holds once the pidfd is open."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False  # gone
    try:
        if not still(pid):
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except OSError:
        return False  # exited meanwhile, or not ours to signal
    finally:
        os.close(pidfd)


def _same(st: ProcStat, pgid: int | None = None):
    def still(pid: int) -> bool:
        now = proc_stat(pid)
        return (now is not None and now.start_time == st.start_time
                and (pgid is None or now.pgid == pgid))
    return still


def signal_command(pgid: int, sig: int, spare_wrapper: str | None) -> int:
    """``sig`` to the command's processes in group ``pgid`` (minus the wrapper's own);
    returns how many were signalled."""
    sent = 0
    for pid, st in command_pids(pgid, spare_wrapper).items():
        sent += _send(pid, sig, _same(st, pgid))
    return sent


#: Scan-and-kill passes at most: a process that forked between a scan and its SIGKILL left a
#: child the next pass finds (``while :; do sleep 100 & done``).
KILL_PASSES = 8


def kill_tree(root: int, leader: int | None, spare_wrapper: str | None,
              marker: str | None, uid: int) -> int:
    """SIGKILL to ``root``'s descendants (the wrapper's own last), then to ``uid``'s processes
    carrying ``marker`` (``NAME=value`` in the environment), pass after pass until one finds
    nothing (at most :data:`KILL_PASSES`); returns how many were hit."""
    total = 0
    for _ in range(KILL_PASSES):
        hit = _kill_pass(root, leader, spare_wrapper, marker, uid)
        total += hit
        if not hit:
            break
    return total


def _kill_pass(root: int, leader: int | None, spare_wrapper: str | None,
               marker: str | None, uid: int) -> int:
    tree = descendants(root)
    stats = _all_stats()
    wrapper = _wrapper_pids(leader, stats, spare_wrapper) if leader is not None else set()
    hit = 0
    for pid, st in tree.items():
        if pid not in wrapper:
            hit += _send(pid, signal.SIGKILL, _same(st))
    if marker is not None:
        needle = marker.encode()
        me = os.getpid()
        for pid in stats:
            if pid != me and pid not in wrapper and _carries(pid, needle, uid):
                hit += _send(pid, signal.SIGKILL, lambda p: _carries(p, needle, uid))
    for pid in wrapper:
        if pid in stats:
            hit += _send(pid, signal.SIGKILL, _same(stats[pid]))
    return hit
