"""Deleting a session: close it, remember its id, then remove its directory crash-safely.

Theory of operation (STORAGE.md §1, PROTOCOL.md §3.1 ``session.delete``):

* **Busy.** A session with running tool calls, pending approvals or a running turn is busy:
  without ``force`` the delete is refused (``SessionBusy``, ``-32013`` ``SESSION_BUSY``) and
  nothing changes. With ``force`` its turn and calls are cancelled as ``turn.cancel`` and
  ``tool.cancel`` do (calls settle ``TOOL_CANCELLED`` / ``APPROVAL_CANCELLED``, durably, so a
  client following them sees why), then the session is closed; all of it bounded by
  :data:`FORCE_WAIT_SECONDS`: a session that has not finished by then is not deleted
  (``StorageFailure``; ask again).
* **Order.** Once the session has finished (its log closed, its lock released) and no call
  host of it is alive (``end_host`` for any left), its id is appended to the **deleted-ids
  ledger** ``<state>/deleted.ids`` (one id a line, fsync'd), then ``sessions/<id>`` is renamed
  to the **tombstone** ``sessions/.deleting-<id>`` (fsync of ``sessions/``), then the
  tombstone is removed. A tombstone's name is not a valid id, so it never lists, never
  opens and is never resumed; a crash after the rename leaves only the tombstone, and the
  registry's start-up :meth:`Deletions.sweep` removes every tombstone before the daemon
  serves. A crash before the rename leaves the session whole (and its id in the ledger,
  which only means the id stays unused).
* **Ledger.** :meth:`Deletions.taken` is what ``mint_session_id`` asks: an id in the ledger,
  or one with a directory or tombstone, is never minted again. The ledger is read once at
  start; it grows 13 bytes per deleted session (a million deletions are 13 MB) and is never
  compacted: ids are only minted here, and the guarantee must not depend on the clock.
* **Audit.** Every delete is one ``session.deleted`` line in the daemon log: ``session``,
  ``name``, ``title``, ``by`` (uid, None for retention),
  ``freed_bytes``, ``forced``, ``cancelled``, ``why``. ``freed_bytes`` is the sum of the
  session's file sizes once its work has stopped and before it is closed: the last snapshot
  and summary the close writes are removed with it but not counted (they were never there to
  free), so a ``session.prune`` dry run, which measures the sessions as they stand, answers
  the same ``freedBytes`` as the real prune of the same sessions.
* **Test hook.** ``DSH_TEST_FAULT=delete-kill:TOKEN`` SIGKILLs the daemon between the rename
  and the removal when the session's cwd contains TOKEN (``dshd.sessions.faults``).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import structlog
import trio

from ..errors import LimitExceeded, StorageFailure, out_of_files
from ..paths import is_valid_id
from ..storage.sidecar import fsync_dir

log = structlog.get_logger("dshd.deletion")

__all__ = ["FORCE_WAIT_SECONDS", "LEDGER_NAME", "TOMBSTONE_PREFIX", "Deletions", "SessionBusy",
           "busy_count", "tree_bytes"]

#: The deleted-ids ledger, in the state directory.
LEDGER_NAME = "deleted.ids"
#: ``sessions/<TOMBSTONE_PREFIX><id>``: a session being removed (never a valid id: the dot).
TOMBSTONE_PREFIX = ".deleting-"
#: A forced delete waits this long for the session's calls and turn to settle, seconds.
FORCE_WAIT_SECONDS = 30.0


class SessionBusy(LimitExceeded):
    """``session.delete`` of a busy session without ``force`` (``-32013`` SESSION_BUSY)."""

    def __init__(self, session_id: str, running: int) -> None:
        super().__init__(
            f"session {session_id} is busy ({running} running call(s), approval(s) or turn); "
            "nothing was deleted. Wait for it to finish, or delete it with --force "
            "(force: true), which cancels them first",
            {"code": "SESSION_BUSY", "running": running})


def busy_count(session) -> int:
    """What keeps ``session`` busy: running calls (a call at its approval gate is one),
    pending approvals not counted there, and 1 for a running turn."""
    pending = len(session._approvals.pending)
    turn = 1 if session.agent is not None and session.agent.busy() else 0
    return max(session.running, pending) + turn


def tree_bytes(path: Path) -> int:
    """The apparent size of the tree at ``path`` as ``du -sb`` counts it: the sizes of its
    files, links and directories, ``path`` included (0 when it is gone). A person checks a
    bound with ``du``; a sum of the files alone read 10-20% lower on a state of many small
    sessions (every directory is a block)."""
    try:
        total = os.lstat(path).st_size
    except OSError:
        return 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_size
    return total


class Deletions:
    """The ledger, the tombstones and the removal of one state directory (module doc)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.sessions_dir = self.state_dir / "sessions"
        self.ledger = self.state_dir / LEDGER_NAME
        self._deleted: set[str] = set()
        try:
            text = self.ledger.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            text = ""
        self._deleted = {line for line in text.split() if is_valid_id(line)}
        #: A crash tore the last line: the next id starts on a line of its own.
        self._torn = bool(text) and not text.endswith("\n")

    def taken(self, session_id: str) -> bool:
        """True when ``session_id`` was ever used here (ledger, directory or tombstone)."""
        return (session_id in self._deleted
                or os.path.lexists(self.sessions_dir / session_id)
                or os.path.lexists(self.sessions_dir / (TOMBSTONE_PREFIX + session_id)))

    def _remember(self, session_id: str) -> None:
        fresh = not self.ledger.exists()
        fd = os.open(self.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (b"\n" if self._torn else b"") + session_id.encode("ascii") + b"\n")
            self._torn = False
            os.fsync(fd)
        finally:
            os.close(fd)
        if fresh:
            fsync_dir(self.state_dir)
        self._deleted.add(session_id)

    def remove(self, session_id: str, *, kill_after_rename: bool = False) -> int:
        """Ledger, rename to the tombstone, remove it (module doc: order); the bytes freed.
        Blocking: run in a worker thread."""
        from ..execution.hostlink import end_host

        session_dir = self.sessions_dir / session_id
        for call_dir in sorted(session_dir.glob("calls/*")):
            if (call_dir / "host.json").exists():
                end_host(call_dir)  # a host the wind-down left: never remove its dir under it
        freed = tree_bytes(session_dir)
        self._remember(session_id)
        tombstone = self.sessions_dir / (TOMBSTONE_PREFIX + session_id)
        os.rename(session_dir, tombstone)
        fsync_dir(self.sessions_dir)
        if kill_after_rename:  # DSH_TEST_FAULT=delete-kill: a crash mid-delete
            os.kill(os.getpid(), signal.SIGKILL)
        shutil.rmtree(tombstone, ignore_errors=True)
        if os.path.lexists(tombstone):  # the session is gone (it never lists); the rest later
            log.warning("session.delete_incomplete", session=session_id,
                        hint="its tombstone is removed at the next start")
        return freed

    def sweep(self) -> int:
        """At start: remove every tombstone an interrupted delete left; how many. Blocking."""
        try:
            names = [n for n in os.listdir(self.sessions_dir) if n.startswith(TOMBSTONE_PREFIX)]
        except FileNotFoundError:
            return 0
        for name in names:
            session_id = name[len(TOMBSTONE_PREFIX):]
            if is_valid_id(session_id) and session_id not in self._deleted:
                self._remember(session_id)  # the rename came first only if this did; be sure
            shutil.rmtree(self.sessions_dir / name, ignore_errors=True)
            log.info("session.delete_finished", session=session_id,
                     hint="a delete interrupted by a crash was finished at start")
        return len(names)


async def _cancel_work(session, deadline: float) -> None:
    """Cancel the running turn and calls as ``turn.cancel`` / ``tool.cancel`` would (so their
    results say "cancelled", not "dshd is shutting down") and wait, until ``deadline``, for
    them to settle; what is left then the close cancels."""
    if session.agent is not None:
        session.agent.cancel()
    call_ids = list(session._calls.running)
    for call_id in call_ids:
        session.cancel_call(call_id)
    with trio.move_on_at(deadline):
        for call_id in call_ids:
            await session.wait_result(call_id, max(deadline - trio.current_time(), 0.001))
        while session.agent is not None and session.agent.busy():
            await trio.sleep(0.05)  # a turn ends at its next await; bounded by the deadline


async def delete_session(registry, session, *, force: bool, by: int | None, why: str,
                         kill_after_rename: bool = False) -> dict:
    """Delete the open ``session`` (module doc); the caller holds the registry's opening
    lock of its id. ``{"deleted": True, "cancelled": n, "freedBytes": n}``."""
    busy = busy_count(session) if session.usable() else 0
    if busy and not force:
        raise SessionBusy(session.id, busy)
    info = session.info()
    deadline = trio.current_time() + FORCE_WAIT_SECONDS
    if busy:
        await _cancel_work(session, deadline)
    held = await trio.to_thread.run_sync(tree_bytes, registry.sessions_dir / session.id)
    session.close(deadline, "cancel")
    with trio.move_on_at(deadline + 5):
        await session.finished.wait()
    if not session.finished.is_set():
        raise StorageFailure(f"session {session.id} did not finish stopping within "
                             f"{FORCE_WAIT_SECONDS:g} s; nothing was deleted: ask again")
    try:
        await trio.to_thread.run_sync(
            lambda: registry.deletions.remove(session.id, kill_after_rename=kill_after_rename))
        freed = held  # module doc: what the session held, not what its close added
    except OSError as exc:
        if (registry.sessions_dir / session.id).exists():  # before the rename: it is whole
            raise StorageFailure(
                f"session {session.id} could not be deleted: {exc.strerror or exc} "
                f"({exc.filename}); it is still there: "
                + (out_of_files(exc) or "check the state directory's permissions and free "
                   "space") + ", then ask again") from None
        log.warning("session.delete_incomplete", session=session.id, error=str(exc),
                    hint="renamed to its tombstone: removed at the next start")
        freed = 0
    registry.forget_deleted(session.id)
    log.info("session.deleted", session=session.id, name=info.get("name"),
             title=info.get("title"), by=by, freed_bytes=freed, forced=bool(force and busy),
             cancelled=busy, why=why)
    return {"deleted": True, "cancelled": busy, "freedBytes": freed}
