"""Session methods (PROTOCOL.md §3.1): create, list, get, events, setApprovalPolicy,
setSandbox, find, rename.

Theory of operation: what ``session.create`` is given is checked before anything is made: the
params struct checks shapes and caps (``protocol.methods``), the handler what needs the
machine (the cwd exists, is not dshd's state directory nor a refused workspace, the caller
can enter it; env names are shell names, none of dshd's own). A session's info is the
registry's, typed as ``SessionInfo``; a list shows only the sessions the caller may use, and
``session.find`` resolves a reference over those only (``dshd.sessions.names.find``: a
session of another user is never named, matched or counted in an AMBIGUOUS answer). A name
is unique per owner (NAME_TAKEN names the holder).
"""

from __future__ import annotations

import os

import msgspec
import trio

from protocol import methods as m

from .. import identity
from ..errors import InvalidParams, PermissionDenied, StorageFailure
from ..execution.sandbox import refused_workspace
from ..paths import is_within
from ..sessions.names import find
from ..storage.errors import LogCorrupt
from ..storage.intact import read_intact
from ..storage.summary import summary_owner
from . import port
from .context import ConnectionPort, may_use

__all__ = [
    "RESERVED_ENV", "session_create", "session_events", "session_find", "session_get",
    "session_list", "session_rename", "session_set_policy", "session_set_sandbox",
]

#: Names dshd puts in every tool's environment; a session env must not override them (EXEC.md §1).
RESERVED_ENV = m.RESERVED_ENV


def _check_env(env: dict[str, str]) -> None:
    problem = m.env_problem(env)
    if problem is not None:
        raise InvalidParams(problem, field="env")


def _resolved_cwd(conn: ConnectionPort, given: str) -> str:
    """``given`` (an existing absolute directory) resolved, once it is a directory a session
    may work in (else raise)."""
    # Stored resolved: each call pins this path by fd and refuses one that leads elsewhere
    # (EXEC.md §3), so a symlinked cwd would be refused at every call.
    cwd = os.path.realpath(given)
    if is_within(cwd, conn.daemon.state_dir):
        raise InvalidParams(
            f"cwd {cwd!r} lies inside dshd's state directory; pick a project directory",
            field="cwd")
    if refusal := refused_workspace(os.path.normpath(given)) or refused_workspace(cwd):
        raise InvalidParams(refusal, field="cwd")
    if not identity.can_enter(cwd, conn.uid):
        raise PermissionDenied(f"cwd {cwd!r} is not a directory you can enter; tools run as you")
    return cwd


async def session_create(conn: ConnectionPort,
                         p: m.SessionCreateParams) -> m.SessionCreateResult:
    if not os.path.isabs(p.cwd):
        raise InvalidParams(f"cwd must be an absolute directory, got {p.cwd!r}", field="cwd")
    if not os.path.isdir(p.cwd):
        raise InvalidParams(f"cwd {p.cwd!r} is not an existing directory", field="cwd")
    _check_env(p.env or {})
    cwd = _resolved_cwd(conn, p.cwd)
    session = await port.create_session(conn, cwd, p.title, p.approval_policy, p.sandbox, p.env,
                                        p.name)
    return m.SessionCreateResult(session_id=session.id)


def session_info(info: dict) -> m.SessionInfo:
    """A SessionInfo dict of the registry as the struct (the key order is the struct's)."""
    return msgspec.convert(info, m.SessionInfo)


async def session_list(conn: ConnectionPort, p: m.EmptyParams) -> m.SessionListResult:
    infos = await conn.daemon.registry.list()
    return m.SessionListResult(
        sessions=[session_info(i) for i in infos if may_use(conn, i.get("owner"))])


async def session_get(conn: ConnectionPort, p: m.SessionGetParams) -> m.SessionInfo:
    return session_info((await port.open_session(conn, p.session_id)).info())


async def session_events(conn: ConnectionPort,
                         p: m.SessionEventsParams) -> m.SessionEventsResult:
    # The log's own event structs: encoded as they are (the result's Raw is the reading side);
    # old ones are read from disk and verified. A damaged log (it does not open, or a read
    # meets a damaged frame) answers its intact events first (`_intact_events`).
    try:
        session = await port.open_session(conn, p.session_id)
        events = await session.events(p.after_seq, p.limit)
    except (StorageFailure, LogCorrupt) as exc:
        if not (isinstance(exc.data, dict) and exc.data.get("code") == "LOG_DAMAGED"):
            raise
        return await _intact_events(conn, p)
    return m.SessionEventsResult(events=events, last_seq=session.last_seq)


async def _intact_events(conn: ConnectionPort,
                         p: m.SessionEventsParams) -> m.SessionEventsResult:
    """The events of a damaged log before its damage, read only (``storage.intact``): a
    page of them says ``lastSeq`` one past its last event (there is more: the damage); the
    page that starts at the damage is -32014 ``LOG_DAMAGED`` with ``offset`` and
    ``afterSeq``. Only its owner (by its summary) or root / dshd's user may read it."""
    session_dir = conn.daemon.registry.sessions_dir / p.session_id
    owner = summary_owner(session_dir, p.session_id)
    if conn.uid not in (0, os.geteuid()) and (owner is None or owner != conn.uid):
        raise PermissionDenied(f"session {p.session_id} is damaged and its owner is not "
                               "known; only root or dshd's user may read it")
    events, damage = await trio.to_thread.run_sync(
        read_intact, session_dir, p.session_id, p.after_seq, p.limit)
    if events:
        return m.SessionEventsResult(events=events,
                                     last_seq=events[-1].seq + (damage is not None))
    if damage is None:
        return m.SessionEventsResult(events=[], last_seq=p.after_seq)
    raise StorageFailure(
        f"session {p.session_id}: the log is damaged at byte {damage.offset} ({damage.reason}),"
        f" after seq {p.after_seq}; the events before it are intact (`dsh fsck` checks it)",
        {"code": "LOG_DAMAGED", "offset": damage.offset, "afterSeq": p.after_seq})


async def session_set_policy(conn: ConnectionPort,
                             p: m.SetApprovalPolicyParams) -> m.EmptyResult:
    session = await port.open_session(conn, p.session_id)
    await session.set_policy(p.policy, source="session.setApprovalPolicy")
    return m.EmptyResult()


async def session_set_sandbox(conn: ConnectionPort, p: m.SetSandboxParams) -> m.EmptyResult:
    session = await port.open_session(conn, p.session_id)
    await session.set_sandbox(p.sandbox, source="session.setSandbox", by=conn.uid)
    return m.EmptyResult()


async def session_find(conn: ConnectionPort, p: m.SessionFindParams) -> m.SessionFindResult:
    cwd = None if p.cwd is None else os.path.realpath(p.cwd)  # sessions store theirs resolved
    infos = [i for i in await conn.daemon.registry.list() if may_use(conn, i.get("owner"))]
    info, how = find(infos, p.ref, cwd, _busy_in(conn) if p.running else None)
    return m.SessionFindResult(session_id=info["sessionId"], how=how, name=info.get("name"))


def _busy_in(conn: ConnectionPort):
    """``session.find``'s ``running``: a session with a running call or a running turn."""
    registry = conn.daemon.registry

    def busy(info: dict) -> bool:
        if info.get("running"):
            return True
        session = registry.opened(info["sessionId"])
        agent = getattr(session, "agent", None) if session is not None else None
        return agent is not None and agent.busy()
    return busy


async def session_rename(conn: ConnectionPort, p: m.SessionRenameParams) -> m.EmptyResult:
    session = await port.open_session(conn, p.session_id)
    await conn.daemon.registry.rename(session, p.name)
    return m.EmptyResult()
