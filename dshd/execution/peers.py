"""Peer check: refuse a connection made from inside one of this daemon's sandboxes (PROTOCOL.md §1).

Theory of operation
-------------------
A confined tool that reached dshd's socket could ask for a ``danger-full-access`` call and leave
its sandbox. The first walls are on the tool's side: bwrap hides the socket's path (masks that
hold against renames, and a daemon that refuses confined calls once its socket or state
directory moved), and the Landlock launcher's seccomp filter refuses every ``AF_UNIX`` socket.
This module is the daemon's side, for whatever reaches the socket anyway (a hard link of the
socket, a bind mount an admin made, a mask that did not hold):

1. at accept, ``SO_PEERCRED`` gives the connecting process's pid, and ``SO_PEERPIDFD`` (Linux
   6.5+) a pidfd that pins *that* process, so a pid reused after the peer exited is not judged;
2. the peer's ancestry is walked through ``/proc/<pid>/stat`` (at most :data:`MAX_DEPTH` steps,
   up to pid 1 or the first entry that cannot be read): the peer is *confined* when one of its
   ancestors (or itself) is a dsh sandbox — a process whose command line starts with the
   provider's bwrap binary and carries the mark ``--dir /dev/.dsh-sandbox`` (any dshd's: no
   confined tool may drive any dshd). Inside bwrap's pid namespace a tool cannot leave that
   ancestry: orphans are reaped by bwrap's pid 1;
3. afterwards the pidfd must still be alive (not readable); a peer that exited meanwhile is
   refused too, since it could have handed its connection to a process that was not checked.

Landlock calls have no such ancestor to recognise (the launcher execs the command, and a
process can double-fork away from its tree), so for them the seccomp filter is the wall; dshd
is never made a child subreaper (the call hosts of a later design must reparent to pid 1).
A refused peer gets the ``-32001`` line and the connection is closed.
"""

from __future__ import annotations

import os
import select
import socket
import struct

__all__ = ["MAX_DEPTH", "confined_peer", "refuse_confined"]

#: Ancestors walked at most.
MAX_DEPTH = 128
#: ``SO_PEERPIDFD`` (asm-generic value; Python's socket module may not name it).
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)


def _ppid_and_cmdline(pid: int) -> tuple[int, bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read(64 * 1024)
    except OSError:
        return None
    try:
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None
    return ppid, cmdline


def _sandbox_ancestor(pid: int, program: bytes, marker: bytes) -> int | None:
    """The pid of the first process from ``pid`` upwards whose command line is ``program``
    with ``marker`` in it."""
    for _ in range(MAX_DEPTH):
        if pid <= 1:
            return None
        entry = _ppid_and_cmdline(pid)
        if entry is None:
            return None
        ppid, cmdline = entry
        if cmdline.startswith(program + b"\0") and marker in cmdline:
            return pid
        pid = ppid
    return None


def _peer_pidfd(sock: socket.socket) -> int | None:
    try:
        return sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        return None  # older kernel: the pid alone is judged


def _exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def confined_peer(sock: socket.socket, provider: object) -> str | None:
    """Why the peer on ``sock`` must be refused, or None. ``provider``: the daemon's sandbox
    provider; its ``process_marker`` — ``(program, string)``: the sandbox's argv[0] and a
    string only this daemon's sandbox command lines carry — says what to look for (None, or no
    such attribute: nothing to check). Never raises."""
    markers = getattr(provider, "process_marker", None)
    if not markers:
        return None
    program, marker = markers
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
    except OSError:
        return None
    pidfd = _peer_pidfd(sock)
    try:
        found = _sandbox_ancestor(pid, os.fsencode(program), os.fsencode(marker))
        if pidfd is not None and _exited(pidfd):
            return f"the connecting process {pid} exited before it could be checked"
    finally:
        if pidfd is not None:
            os.close(pidfd)
    if found is not None:
        return f"the connecting process {pid} runs inside this daemon's sandbox (bwrap {found})"
    return None


def refuse_confined(sock: socket.socket, provider: object, log) -> bool:
    """:func:`confined_peer`, logged (``connection.confined_peer``) when it refuses."""
    why = confined_peer(sock, provider)
    if why is not None:
        log.warning("connection.confined_peer", reason=why)
    return why is not None
