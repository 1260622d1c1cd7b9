"""Whose tool is this? Session owners, and running a tool as its owner (PROTOCOL.md §1).

Theory of operation: a user daemon serves one user, so every tool runs as that user. A system
daemon (root, group ``dsh`` let in) must never turn "member of group dsh" into "root": each
session records the uid that created it (its owner); only the owner (or root) may use it, and
its tools run with the owner's uid, gid and groups. Because the child enters its working
directory before it drops root, :func:`can_enter` checks up front that the owner could reach
that directory by itself (mode bits along the path; ACLs are not consulted, so it can only be
stricter than the kernel).
"""

from __future__ import annotations

import os
import pwd
import stat

from .execution.spawn import RunAs


def run_as_for(owner: int | None) -> RunAs | None:
    """The identity to run an owner's tools as, or None to run as the daemon itself."""
    if owner is None or os.geteuid() != 0 or owner == 0:
        return None
    try:
        pw = pwd.getpwuid(owner)
    except KeyError:
        return RunAs(uid=owner, gid=owner)
    groups = tuple(g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != pw.pw_gid)
    return RunAs(uid=owner, gid=pw.pw_gid, groups=groups)


def _allows(st: os.stat_result, ident: RunAs, bits: tuple[int, int, int]) -> bool:
    user_bit, group_bit, other_bit = bits
    if st.st_uid == ident.uid:
        return bool(st.st_mode & user_bit)
    if st.st_gid == ident.gid or st.st_gid in ident.groups:
        return bool(st.st_mode & group_bit)
    return bool(st.st_mode & other_bit)


def can_enter(path: str, owner: int | None) -> bool:
    """Could ``owner`` reach and list directory ``path`` on its own (x on every component)?"""
    ident = run_as_for(owner)
    if ident is None:
        return True
    current = "/"
    parts = [p for p in os.path.normpath(path).split("/") if p]
    try:
        for part in parts:
            st = os.stat(current)
            if not _allows(st, ident, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)):
                return False
            current = os.path.join(current, part)
        st = os.stat(current)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and _allows(st, ident, (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH))
        and _allows(st, ident, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH))
    )
