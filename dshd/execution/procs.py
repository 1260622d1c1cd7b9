"""Finding and signalling a call's processes, by ``/proc`` and pidfd (EXEC.md §2).

Theory of operation: a command runs as the leader of its own process group; the runner
(:mod:`dshd.execution.process`) stops it in two steps, and this module does the finding and
the signalling for both:

* :func:`term_command` -- SIGTERM to *the command*: the group's live members (a ``/proc``
  scan, :func:`command_pids`) minus the sandbox wrapper's own processes (bwrap's outer process
  and its pid-1 child, whose death would tear the sandbox down before the command's ``trap``
  ran);
* :func:`kill_all` -- SIGKILL to the group (``killpg`` while the leader is unreaped, so the
  group id cannot have been reused; afterwards the members one by one), then to every process
  of the call's uid whose environment carries the run's token (``DSH_RUN=<token>``): children
  that left the group with ``setsid``.

Every single signal goes through a pidfd opened first and is sent only if, with the pidfd
held, the process still is what the scan found (still in the group; still carrying the token):
a pid that exited and was reused between the scan and the kill is never hit. Pure ``/proc``
and ``os`` calls, synchronous and quick; no trio.
"""

from __future__ import annotations

import os
import signal

__all__ = ["carries", "command_pids", "kill_all", "kill_marked", "marked_pids", "proc_stat",
           "signal_pid", "term_command"]


def proc_stat(pid: int | str) -> tuple[int, int, str] | None:
    """``(ppid, pgid, comm)`` of a live (not zombie) process from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    head, _, tail = raw.rpartition(b")")
    fields = tail.split()
    if len(fields) < 3 or fields[0] == b"Z":
        return None
    comm = head.partition(b"(")[2].decode(errors="replace")
    return int(fields[1]), int(fields[2]), comm


def command_pids(pgid: int, spare_wrapper: str | None) -> list[int]:
    """Live members of process group ``pgid`` (a ``/proc`` scan), minus the sandbox wrapper's
    own processes: the leader and its children named ``spare_wrapper`` when the leader is
    named so (bwrap with a pid namespace is an outer process and an inner pid 1)."""
    members: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(name)
            if st is not None and st[1] == pgid:
                members[int(name)] = (st[0], st[2])
    spare: set[int] = set()
    leader = members.get(pgid)
    if spare_wrapper is not None and leader is not None and leader[1] == spare_wrapper:
        spare = {pgid} | {p for p, (ppid, comm) in members.items()
                          if ppid == pgid and comm == spare_wrapper}
    return [p for p in members if p not in spare]


def carries(pid: int | str, needle: bytes, uid: int) -> bool:
    """True when process ``pid`` belongs to ``uid`` and its environment holds the entry
    ``needle`` (``NAME=value``, exactly)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return False
    return b"\0" + needle + b"\0" in b"\0" + environ.rstrip(b"\0") + b"\0"


def marked_pids(marker: str, uid: int) -> list[int]:
    """Live processes of ``uid`` whose environment holds the entry ``marker`` (``NAME=value``)."""
    needle = marker.encode()
    me = os.getpid()
    return [int(name) for name in os.listdir("/proc")
            if name.isdigit() and int(name) != me and carries(name, needle, uid)]


def kill_marked(pid: int, marker: str, uid: int) -> None:
    """SIGKILL ``pid`` through a pidfd if, once the pidfd is held, it still carries ``marker``:
    a pid that exited and was reused by another run's process since the scan is not hit."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # gone
    try:
        if carries(pid, marker.encode(), uid):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass  # exited meanwhile, or not ours to signal
    finally:
        os.close(pidfd)


def signal_pid(pid: int, pgid: int | None, sig: signal.Signals) -> None:
    """Signal ``pid`` through a pidfd, after checking (``pgid``) it is still in the group: a
    pid that exited and was reused since the scan is not hit."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # gone
    try:
        if pgid is not None:
            st = proc_stat(pid)
            if st is None or st[1] != pgid:
                return
        signal.pidfd_send_signal(pidfd, sig)
    except OSError:
        pass  # exited meanwhile, or not ours to signal
    finally:
        os.close(pidfd)


def term_command(pgid: int, spare_wrapper: str | None) -> None:
    """SIGTERM to the command's processes in group ``pgid``: the group's members minus the
    sandbox wrapper's own (named ``spare_wrapper``; see :func:`command_pids`)."""
    for pid in command_pids(pgid, spare_wrapper):
        signal_pid(pid, pgid, signal.SIGTERM)


def kill_all(pgid: int, *, leader_reaped: bool, marker: str | None, uid: int) -> None:
    """SIGKILL to group ``pgid``, then to the run's processes that left it (``marker``: the
    run's ``DSH_RUN=<token>`` entry, looked for among ``uid``'s processes).

    ``killpg`` only while the leader is unreaped (``leader_reaped`` False: its pid, hence the
    group's id, cannot have been reused); afterwards the members found in ``/proc`` one by
    one."""
    if not leader_reaped:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is empty (or holds only processes we may not signal)
    else:
        for pid in command_pids(pgid, None):
            signal_pid(pid, pgid, signal.SIGKILL)
    if marker is not None:
        for pid in marked_pids(marker, uid):
            kill_marked(pid, marker, uid)
