"""The bound on the RAM the running calls' private tmpfs mounts hold together (EXEC.md §3).

Theory of operation: see :class:`TmpBudget` -- one lease file per running call, ``flock``ed
through an fd the sandbox (bwrap ``--sync-fd``) keeps open for its lifetime; the locked leases
are counted against the total before a new call is let in, and the call is refused
(:class:`~dshd.execution.confine.SandboxUnavailable`) when the total is spent.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import time

from dshd.execution.confine import SandboxUnavailable

__all__ = ["DEFAULT_TMP_SIZE", "DEFAULT_TMP_TOTAL", "TmpBudget"]

#: Defaults of the private tmpfs caps (config ``tmp_size_bytes`` / ``tmp_total_bytes``).
DEFAULT_TMP_SIZE = 512 * 1024 * 1024
DEFAULT_TMP_TOTAL = 8 * 1024 * 1024 * 1024


class TmpBudget:
    r"""Bounds the RAM that the running calls' private tmpfs mounts may hold together.

    The pages of a sandbox's ``/tmp`` count against dshd's cgroup, so each call's tmpfs mounts
    are capped (``per_call`` bytes in all, see the bwrap provider) and the sum over running calls
    is bounded by ``total``. A call's share is a *lease*: a file ``<lease_dir>/lease-<token>``
    that :meth:`reserve` creates and ``flock``\ s (shared) through an fd it returns; that fd is
    passed to bwrap (``--sync-fd``: bwrap keeps it open while the sandbox lives) and the daemon
    closes its own copy after the spawn. The lock belongs to the open file description, so it
    is held from the reservation on — with no window in which a running call's lease looks
    unlocked — until the last process of the sandbox is gone (or, if the spawn never happens,
    until the daemon closes the fd). A lease counts while it is locked; an unlocked one is
    removed. The file is made under a ``new-`` name and renamed only once locked, so a count
    never sees it unlocked. A call that would take the sum past ``total`` fails closed
    (:class:`SandboxUnavailable`); it is not queued.

    (Before: bwrap ``--chmod``\ ed the lease and took a POSIX lock on it with ``--lock-file``,
    but bwrap takes that lock late in its setup, and a count in between removed the lease of a
    starting call — so 20 calls ran under a budget of 14.)
    """

    NEW_GRACE = 60.0

    def __init__(self, lease_dir: str, per_call: int, total: int) -> None:
        self.lease_dir = lease_dir
        self.per_call = per_call
        self.total = total

    def _counts(self, name: str) -> bool:
        """Whether lease ``name`` still holds its share (removes it when it does not)."""
        path = os.path.join(self.lease_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True  # a sandbox (or a reservation not yet spawned) holds it
            # Unlocked: the call ended. Removed while we hold the lock, so no new holder races.
            try:
                os.unlink(path)
            except OSError:
                pass
            return False
        finally:
            os.close(fd)

    def _sweep_new(self, names: list[str]) -> None:
        """Remove ``new-`` files a crash left behind (older than :data:`NEW_GRACE`)."""
        for name in names:
            if not name.startswith("new-"):
                continue
            path = os.path.join(self.lease_dir, name)
            try:
                if time.time() - os.stat(path, follow_symlinks=False).st_mtime > self.NEW_GRACE:
                    os.unlink(path)
            except OSError:
                pass

    def in_use(self) -> int:
        """How many leases hold a share now (stale ones are removed on the way)."""
        try:
            names = os.listdir(self.lease_dir)
        except FileNotFoundError:
            return 0
        self._sweep_new(names)
        return sum(1 for name in names if name.startswith("lease-") and self._counts(name))

    def reserve(self) -> int:
        """A new lease's locked fd (the caller passes it to the sandbox and closes it), or
        :class:`SandboxUnavailable` when the sum is spent."""
        os.makedirs(self.lease_dir, mode=0o700, exist_ok=True)
        running = self.in_use()
        if (running + 1) * self.per_call > self.total:
            raise SandboxUnavailable(
                f"the private /tmp budget of running calls is spent: {running} running calls "
                f"hold {running * self.per_call} bytes of the {self.total} allowed "
                f"(tmp_total_bytes; {self.per_call} bytes per call, tmp_size_bytes plus /dev/shm "
                "and /run); the call did not run — retry when a call has finished, or raise "
                "tmp_total_bytes"
            )
        token = secrets.token_hex(8)
        new = os.path.join(self.lease_dir, f"new-{token}")
        fd = os.open(new, os.O_CREAT | os.O_EXCL | os.O_RDONLY | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.rename(new, os.path.join(self.lease_dir, f"lease-{token}"))
        except BaseException:
            os.close(fd)
            try:
                os.unlink(new)
            except OSError:
                pass
            raise
        return fd
