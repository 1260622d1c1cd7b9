"""The session registry: mints, opens, lists and closes sessions (PROTOCOL.md §3.1).

Theory of operation: the registry owns a nursery; each open session is a task in it
(``Session.run``). A session is opened for write lazily, on the first request that names it,
and stays open until it has been idle ``session_idle_seconds`` or its place is needed: at
``max_sessions`` a create or open closes the least recently used idle session or is refused
(``dshd.sessions.bound``, which keeps the bound under concurrent requests). The registry
counts the running calls over all open sessions for ``max_calls`` (``running_calls``).
At daemon start, before the server accepts, :meth:`SessionRegistry.resume_unsettled`
opens every session that has a call directory without its ``settled`` marker (found by
listing ``sessions/*/calls/*/``, no log read): its calls that outlived the daemon come back
(``dshd.sessions.resume``; HOST.md §7). Every open computes the session's resume plan (from the log's ``RepairState``) before
repair, so nothing the plan keeps is closed. Sessions that are not open are listed from their
summaries (``dshd.storage.summary.read_summary``: the summary, brought up to date by the
frames after it; never a whole log), cached by the log's size, mtime and inode; a damaged log
is listed as damaged without breaking the list, and a session in which a read found a
damaged old frame (``Session.damaged``) is listed with ``damaged`` added, open or closed;
all closed sessions of one list are read in ONE worker thread (``dshd.sessions.listing``).
Names are unique per owner, checked against the list (``dshd.sessions.names``); a deleted
session is forgotten (``forget_deleted``).
Opening is serialised per session id so two concurrent requests never race
to open the same log.

A session that crashed (``Session.crash``; see ``Session`` on supervision) or is closing stays
in ``open`` until it has finished winding down; a request that names it meanwhile waits for that
(bounded), then reopens the session from its log: a crash never wedges a session, and the
in-process claim is released before the reopen asks for it. A crashed session that had
subscribers is reopened at once (`_revive`, at most ``REVIVE_MAX`` times a minute) and its
subscriptions move over: each gets a base batch of the reopened lane, so a client that follows
the lane sees its calls settle instead of a stream that went silent.

The state directory is reached by its path, so before a session is created or opened from disk
(and once per idle-loop round) the registry checks, through the daemon's lock
(`storage.lock.DaemonLock.verify`), that the path still names the directory this daemon locked.
When it was moved or replaced (``mv state state.old; mkdir state``: a second dshd may now own
the path), session.create and opens fail closed with `StateDirMoved` (STORAGE_FAILURE), and the
daemon logs ``storage.state_dir_moved`` once. Sessions already open write through their own fds
and stop at their writer's lock check.

Deleting (``delete``, ``dshd.sessions.deletion``) holds the session's opening lock, so no
request reopens it meanwhile; ``run`` first finishes the deletes a crash interrupted.
``DSH_TEST_FAULT`` (a test hook, ``faults.TestFault``) is read here, once, when the registry
is built at daemon start, and handed to every session; unset, it does nothing.
"""

from __future__ import annotations

import functools
import os
import secrets
import string
import time
from pathlib import Path

import structlog
import trio

from ..config import Config
from ..errors import out_of_files, SessionClosing, SessionLimit, SessionNotFound
from ..paths import is_valid_id
from ..storage.errors import LockHeld, StateDirMoved, StorageError
from ..storage.format import Header
from ..storage.reader import list_session_dirs
from ..storage.writer import SessionLog
from ..execution.capture import ShellOutputLimits
from .calls import StopPolicy
from .bound import SessionBound
from .chain import read_index
from .listing import DiskListing
from .names import SessionNames
from .deletion import Deletions, delete_session
from .retention import RetentionNudge
from .faults import TestFault
from .resume import ResumePlan, plan_resume, tail_windows, turn_events, unsettled_sessions
from .session import Session

log = structlog.get_logger("dshd.registry")

_ALPHABET = string.digits + string.ascii_lowercase


def _base36(n: int) -> str:
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = _ALPHABET[r] + out
    return out or "0"


def _not_found(session_id: str) -> str:
    return f"session {session_id} not found; `dsh sessions` lists the sessions"


def mint_session_id(taken=lambda _id: False, first: str | None = None) -> str:
    """Time-ordered, short, opaque: 8 base36 chars of ms + 4 random; never one ``taken``
    (``Deletions.taken``: a deleted id is never reused). ``first``: the first candidate
    (``DSH_TEST_FAULT=mint-id:ID``, to force a collision)."""
    candidate = first
    while candidate is None or taken(candidate):
        rand = "".join(secrets.choice(_ALPHABET) for _ in range(4))
        candidate = _base36(time.time_ns() // 1_000_000) + rand
    return candidate


#: Bound on waiting for a crashed or closing session to release its log before reopening it,
#: seconds (its wind-down ends by its own deadline, ``WIND_DOWN_SECONDS`` after a crash).
REOPEN_WAIT_SECONDS = 30.0
#: Crashed sessions reopened for their subscribers, at most this many times per session a minute.
REVIVE_MAX = 3
#: Closed sessions remembered as damaged (an old frame found damaged by a read), at most.
DAMAGED_MAX = 65_536


class SessionRegistry:
    def __init__(self, config: Config, state_dir: Path, sandbox, daemon_lock=None) -> None:
        self.config = config
        #: Unix time this daemon started (its registry was made): a call's command that ended
        #: before it ended while no daemon ran (HOST.md §7).
        self.started = time.time()
        #: The daemon's `DaemonLock` (None in tests that build a registry without one).
        self._daemon_lock = daemon_lock
        self._moved_logged = False
        self.state_dir = state_dir
        self.sessions_dir = state_dir / "sessions"
        self.sandbox = sandbox
        self.open: dict[str, Session] = {}
        #: Every session whose task still runs: the open ones and closing ones still flushing
        #: (the service watchdog checks each one's writer).
        self.live: dict[str, Session] = {}
        self._opening: dict[str, trio.Lock] = {}
        #: The daemon stops (:meth:`aclose`): no session is opened or created any more -- a
        #: session reopened by a request in flight would re-ask or re-adopt its calls in a
        #: daemon that is going away, and cancel them at its end.
        self.stopping = False
        self._claims: set[str] = set()
        self._last_used: dict[str, float] = {}
        #: ``max_sessions``, kept under concurrent creates and opens (``dshd.sessions.bound``).
        self.bound = SessionBound(self.open, lambda: self.config.max_sessions,
                                  lambda sid: self._last_used.get(sid, 0), self._close)
        #: session id -> why an old frame of its log is damaged (found by a read while it was
        #: open; the summary of a closed one does not read those frames), at most DAMAGED_MAX.
        self._damaged: dict[str, str] = {}
        #: session id -> trio times it was revived after a crash (the last minute's only).
        self._revivals: dict[str, list[float]] = {}
        self._nursery: trio.Nursery | None = None
        #: session.list of the closed sessions, cached (``dshd.sessions.listing``).
        self._listing = DiskListing(self.sessions_dir, self._defaults, self._damaged.get)
        self.names = SessionNames(self.list)
        #: Wakes the retention task when settled output may have filled the state's headroom.
        self.retention = RetentionNudge()
        self._fault = TestFault.parse(os.environ.get("DSH_TEST_FAULT"))
        #: The deleted-ids ledger and the tombstones (``dshd.sessions.deletion``).
        self.deletions = Deletions(state_dir)
        if self._fault is not None:
            log.warning("test_fault.enabled", kind=self._fault.kind,
                        hint="DSH_TEST_FAULT is a test hook; unset it outside tests")

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self.deletions.sweep)  # interrupted deletes, first
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            # Close sessions nobody uses, so their files (log, lock: 2 fds) are released.
            # The limit is read each round (a reload may change it; a round is at most 5 s).
            while True:
                idle = self.config.session_idle_seconds
                await trio.sleep(min(max(idle / 4, 0.05), 5.0))
                try:
                    self.check_state_dir()
                except StateDirMoved:
                    pass  # logged once; creates and opens refuse
                cutoff = trio.current_time() - idle
                for session in list(self.open.values()):
                    if session.idle() and self._last_used.get(session.id, 0) < cutoff:
                        log.info("session.idle_closed", session=session.id)
                        await self._close(session)

    def check_state_dir(self) -> None:
        """Raise `StateDirMoved` (logged once) when the state directory path no longer names
        the directory this daemon locked (module doc). Two stats; no blocking worth a thread."""
        if self._daemon_lock is None:
            return
        try:
            self._daemon_lock.verify()
        except StateDirMoved as exc:
            if not self._moved_logged:
                self._moved_logged = True
                log.error("storage.state_dir_moved", path=str(self.state_dir), reason=str(exc))
            raise

    async def _close(self, session: Session) -> None:
        session.close()
        await session.finished.wait()
        if self.open.get(session.id) is session:
            del self.open[session.id]
        self._last_used.pop(session.id, None)

    async def aclose(self, deadline: float | None = None, policy: StopPolicy = "cancel") -> None:
        """Graceful stop: every session stops its work (``policy``: its calls are cancelled
        and settle, or -- a daemon stop with ``on_stop = "detach"`` -- detached, HOST.md §7),
        flushes and closes its log, by ``deadline`` (a trio time; None: each session's own
        ``WIND_DOWN_SECONDS``). Returns when every session has finished."""
        self.stopping = True
        sessions = list(self.open.values())
        for session in sessions:
            session.close(deadline, policy)
        for session in sessions:
            await session.finished.wait()

    async def _start(self, log_: SessionLog, index=None) -> Session:
        session = Session(log_, self.sessions_dir / log_.header.id, self.config, self.sandbox,
                          running_calls=self.running_calls, written=self.retention.written,
                          fault=self._fault, plan=log_.resume_plan, index=index)
        assert self._nursery is not None
        await self._nursery.start(self._own, session)
        self.open[session.id] = session
        self._last_used[session.id] = trio.current_time()
        return session

    def opened(self, session_id: str) -> Session | None:
        """The open session ``session_id``, or None (never opens one; ``get`` does)."""
        return self.open.get(session_id)

    def open_sessions(self) -> list[Session]:
        return list(self.open.values())

    def live_sessions(self) -> list[Session]:
        """Every session whose task runs, a crashed one winding down included (the watchdog)."""
        return list(self.live.values())

    def running_calls(self) -> int:
        """Unsettled tool calls over every open session (``max_calls`` counts these)."""
        return sum(session.running for session in self.open.values())

    async def _own(self, session: Session, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.live[session.id] = session
        try:
            await session.run(task_status=task_status)
        except Exception:
            # Session.run supervises itself and logs its crash; this is the last resort, so
            # that one session's failure never stops the daemon or the other sessions.
            if session.crash is None:
                log.exception("session.crashed", session=session.id)
        finally:
            if session.damaged is not None:
                self._damaged.pop(session.id, None)
                self._damaged[session.id] = session.damaged
                while len(self._damaged) > DAMAGED_MAX:
                    del self._damaged[next(iter(self._damaged))]
                self._listing.forget(session.id)
            if self.open.get(session.id) is session:
                del self.open[session.id]
            if self.live.get(session.id) is session:
                del self.live[session.id]
            if session.crash is not None and session.subscriptions() and self._nursery:
                self._nursery.start_soon(self._revive, session)

    async def _revive(self, crashed: Session) -> None:
        """Reopen a crashed session for its subscribers and move them over (module doc)."""
        now = trio.current_time()
        recent = [t for t in self._revivals.get(crashed.id, ()) if now - t < 60]
        if len(recent) >= REVIVE_MAX:
            log.error("session.revive_gave_up", session=crashed.id, revivals=len(recent),
                      hint="it crashes again on open; see the session.crashed lines")
            return
        self._revivals[crashed.id] = [*recent, now]
        for key in [k for k, times in self._revivals.items() if now - times[-1] >= 60]:
            del self._revivals[key]  # bounded: only the last minute's revivals are kept
        try:
            session = await self.get(crashed.id)
        except Exception as exc:
            log.error("session.revive_failed", session=crashed.id, error=str(exc))
            return
        for sub in crashed.subscriptions():
            if not sub.closed:  # ended subscriptions are marked so by their subscriber
                session.subscribe(sub, answerer=crashed.is_answerer(sub))

    async def create(
        self,
        cwd: str,
        title: str | None,
        policy: str | None,
        sandbox: str | None,
        env: dict[str, str] | None,
        owner: int | None = None,
        name: str | None = None,
    ) -> Session:
        """A new session; ``name`` is taken for ``owner`` or NAME_TAKEN (InvalidParams)."""
        async with self.names.claim(owner, name):
            return await self._create(cwd, title, policy, sandbox, env, owner, name)

    async def rename(self, session: Session, name: str | None) -> None:
        """Give ``session`` ``name`` (None: none), unique for its owner (NAME_TAKEN)."""
        async with self.names.claim(session.owner, name, except_id=session.id):
            await session.set_name(name)

    async def _create(self, cwd: str, title: str | None, policy: str | None,
                      sandbox: str | None, env: dict[str, str] | None, owner: int | None,
                      name: str | None) -> Session:
        self._refuse_if_stopping()
        self.check_state_dir()
        first = self._fault.token if self._fault and self._fault.kind == "mint-id" else None
        session_id = mint_session_id(self.deletions.taken, first)
        header = Header(id=session_id, createdAt=time.time_ns() // 1_000_000, cwd=cwd, title=title)
        async with self.bound.pinned(session_id):  # not evicted before it is durable
            async with self.bound.place():
                log_ = SessionLog.create(
                    self.state_dir,
                    session_id,
                    header,
                    compression=self.config.compression,
                    coalesce=self.config.coalesce_seconds,
                    claims=self._claims,
                    snapshot_every=self.config.snapshot_every_events,
                )
                session = await self._start(log_)
            try:
                await session.record_settings(
                    policy=policy or self.config.approval_policy,
                    mode=sandbox or self.config.sandbox,
                    env=env or {},
                    source="session.create" if (policy or sandbox) else "config",
                    owner=owner,
                    name=name,
                )
            except StorageError:
                # Never published: drop it whole, so it does not appear later half-made.
                session.discard_unpublished()
                session.close()
                with trio.CancelScope(shield=True):
                    await session.finished.wait()
                raise
        log.info("session.created", session=session_id, cwd=cwd)
        return session

    async def get(self, session_id: str) -> Session:
        """The open session, opening it for write if needed.

        Raises SessionNotFound, LockHeld (another process holds it), LogCorrupt/LogTooNew,
        SessionLimit.
        """
        if not is_valid_id(session_id):
            raise SessionNotFound(_not_found(session_id))
        session = self.open.get(session_id)
        if session is not None and session.usable():
            self._last_used[session_id] = trio.current_time()
            return session
        if self.stopping:
            # A closing session still answers what it holds (a result for a tool.wait in
            # flight); once it has finished it is not opened again in this daemon.
            if session is not None:
                return session
            self._refuse_if_stopping()
        lock = self._opening.setdefault(session_id, trio.Lock())
        async with lock:
            session = self.open.get(session_id)
            if session is not None:
                if session.usable():
                    return session
                # Crashed or closing: let it settle its calls and release its log first.
                with trio.move_on_after(REOPEN_WAIT_SECONDS):
                    await session.finished.wait()
                if self.open.get(session_id) is session and session.finished.is_set():
                    del self.open[session_id]
            self.check_state_dir()  # before the path is used: it may name another dshd's
            if not (self.sessions_dir / session_id).is_dir():
                raise SessionNotFound(_not_found(session_id))
            async with self.bound.place():
                try:
                    log_ = await SessionLog.open_for_write(
                        self.state_dir,
                        session_id,
                        compression=self.config.compression,
                        coalesce=self.config.coalesce_seconds,
                        claims=self._claims,
                        repair=True,
                        output_limits=(self.config.output_max_bytes, self.config.output_max_lines),
                        plan=functools.partial(self._plan, session_id),
                        snapshot_every=self.config.snapshot_every_events,
                    )
                except FileNotFoundError:
                    # A directory without a log: a crash between mkdir and the first publish.
                    raise SessionNotFound(_not_found(session_id)) from None
                return await self._start(log_, await self._index_of(log_))

    async def _index_of(self, log_: SessionLog):
        """The call index of the log's snapshot chain (``chain.read_index``, a worker thread);
        on damage the log is closed again and the session listed as damaged (STORAGE.md §5)."""
        try:
            return await trio.to_thread.run_sync(
                read_index, log_.session_dir, log_.session_id, log_.snapshot_offset,
                log_.snapshot_seq, log_.durable_bytes)
        except BaseException as exc:
            if isinstance(exc, StorageError):
                self._damaged[log_.session_id] = str(exc)
                self._listing.forget(log_.session_id)
            with trio.CancelScope(shield=True):
                await log_.aclose()
            raise

    def _defaults(self) -> dict:
        return {"approvalPolicy": self.config.approval_policy, "sandbox": self.config.sandbox,
                "owner": None}

    def _refuse_if_stopping(self) -> None:
        if self.stopping:
            raise SessionClosing("dshd is stopping; no session is opened or created until it "
                                 "restarts: ask again then")

    async def _plan(self, session_id: str, state) -> ResumePlan:
        """The resume plan of a session being opened (``dshd.sessions.resume``) from its
        ``RepairState``, with the log tails of the calls repair will close
        ``TOOL_OUTCOME_UNKNOWN``."""
        session_dir = self.sessions_dir / session_id
        plan = await trio.to_thread.run_sync(
            plan_resume, state, session_dir,
            functools.partial(turn_events, session_dir, session_id))
        limits = ShellOutputLimits(max_bytes=self.config.output_max_bytes,
                                   max_lines=self.config.output_max_lines)
        plan.windows = await tail_windows(session_dir, plan.unknown, limits)
        plan.since = self.started
        return plan

    async def delete(self, session_id: str, *, force: bool, by: int | None, why: str) -> dict:
        """Delete the session (``dshd.sessions.deletion``): opened, so its state is known,
        and held under its opening lock so no request reopens it meanwhile."""
        session = await self.get(session_id)
        async with self._opening.setdefault(session_id, trio.Lock()):
            session = self.open.get(session_id) or session  # reopened meanwhile: that one
            kill = bool(self._fault and self._fault.kind == "delete-kill"
                        and self._fault.token in session.cwd)
            return await delete_session(self, session, force=force, by=by, why=why,
                                        kill_after_rename=kill)

    def forget_deleted(self, session_id: str) -> None:
        """Drop what the registry remembers of a deleted session (its name is free once its
        directory is gone: ``dshd.sessions.names``)."""
        for table in (self._last_used, self._damaged, self._revivals, self._opening):
            table.pop(session_id, None)
        self._listing.forget(session_id)

    async def resume_unsettled(self) -> int:
        """At daemon start, before it accepts: open every session that has a call dir without
        its ``settled`` marker (HOST.md §7), so its calls are re-adopted, settled or re-asked
        at once. At most ``max_sessions``; one that fails to open is logged and skipped.
        Returns how many were opened."""
        ids = await trio.to_thread.run_sync(unsettled_sessions, self.sessions_dir)
        opened = 0
        for session_id in ids[: self.config.max_sessions]:
            try:
                await self.get(session_id)
            except Exception as exc:  # one damaged session must not keep the daemon down
                log.error("session.resume_failed", session=session_id, error=str(exc))
                continue
            opened += 1
        if len(ids) > self.config.max_sessions:
            log.warning("session.resume_skipped", skipped=len(ids) - self.config.max_sessions,
                        hint="more sessions have unsettled calls than max_sessions; they open "
                             "when a request names them")
        if ids:
            log.info("session.resumed", sessions=opened)
        return opened

    async def list(self) -> list[dict]:
        """SessionInfo for every session; damaged ones carry ``damaged``. The closed ones
        come from their summaries in ONE worker thread, cached (``dshd.sessions.listing``).
        Out of file descriptors, the sessions directory cannot be read: the open sessions
        and the closed ones listed before are answered (a list, never an error)."""
        try:
            ids = await trio.to_thread.run_sync(list_session_dirs, self.state_dir)
        except OSError as exc:
            if out_of_files(exc) is None:
                raise
            # Out of fds: the directory cannot be read; list what is known (the open
            # sessions and the closed ones listed before), not an error for every client.
            log.warning("session.list_partial", error=str(exc), hint=out_of_files(exc))
            ids = sorted(set(self.open) | self._listing.known())
        infos = [s.info() for s in map(self.open.get, ids) if s is not None]
        closed = [i for i in ids if i not in self.open]
        found, fresh = await trio.to_thread.run_sync(self._listing.infos, closed)
        self._listing.store(fresh, closed)
        infos += found
        infos.sort(key=lambda i: (i.get("createdAt") or 0, i["sessionId"]))
        return infos


__all__ = ["SessionRegistry", "unsettled_sessions", "SessionNotFound", "SessionLimit", "LockHeld"]
