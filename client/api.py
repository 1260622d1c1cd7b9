"""Typed calls of the dshd client protocol (PROTOCOL.md §2–§3.6) over a ``Connection``, on
anyio (trio or asyncio, whichever runs the caller).

Theory of operation: ``connect`` resolves the socket path by the spec's rule
(``client.paths.socket_path``: ``--socket``, ``DSH_SOCKET``, defaults), opens the socket, runs a
``Connection`` for the duration of the block and sends ``initialize`` first -- within
``connect_timeout()`` seconds (``DSH_CONNECT_TIMEOUT``, else 10): a daemon alive but unable to
serve (out of file descriptors, the kernel queues the connection and nobody reads it) is
``DaemonUnresponsive``, not a hang; ``approvals=True`` makes the connection an approval
answerer for every session it subscribes to (§3.4). A missing or refusing socket is
``DaemonNotRunning``, whose message says how to start the daemon.

Every request -- ``initialize``, each method below, a ``Subscription``'s ``subscribe`` and
``unsubscribe`` -- goes through ``Client.request(method, params)``: the one place params are
encoded and results decoded, with the structs the daemon decodes and encodes
(``protocol.methods.METHODS``: name -> params, result; msgspec's ``asyncio-kv`` pattern). Each
method is one wrapper here that builds its params struct and returns the result struct (or
the one field of it that matters); an event of ``session.events`` decodes with
``protocol.events``. Results read by attribute (``result.exit_code``) and, for code written
against the wire's JSON, by wire name (``result["exitCode"]``, ``protocol.jsonview``).
``Client.call`` is the untyped door: plain JSON params, plain JSON result. The daemon's errors
come out as ``protocol.rpc.RpcError`` with its ``code``, ``message`` and ``data``; a result
that does not have its protocol shape is ``BadAnswer``. This layer names the calls, it does
not model the domain.
"""

from __future__ import annotations

import math
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

import anyio
import msgspec

import client
from client.paths import socket_path as resolve_socket_path
from protocol import events
from protocol import methods as m
from protocol.approvals import (ApprovalRule, ApprovalRuleSpec, ApprovalRulesParams,
                                PendingApproval, RevokeRuleParams)
from client.raw import OutputFollow, ReadResult
from client.subscription import Subscription
from protocol.rpc import RpcError
from client.transport import (
    DEFAULT_INBOX_BOUND,
    Connection,
    ConnectionLost,
    DshClientError,
    open_connection,
)

__all__ = ["Client", "connect", "DaemonNotRunning", "DaemonUnresponsive", "ConnectFailed",
           "CallLost", "DaemonGone", "BadAnswer", "PROTOCOL_VERSION", "dsh_version", "connect_timeout"]

PROTOCOL_VERSION = m.PROTOCOL_VERSION
#: How long ``connect`` waits for the socket and the ``initialize`` answer (seconds).
CONNECT_TIMEOUT_S = 10.0


class DaemonNotRunning(DshClientError):
    """Nothing listens on the socket (missing, or a stale socket file that refuses)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        super().__init__(
            f"dshd is not running at {self.path}; start it with `dshd` "
            "(or `systemctl --user start dshd`)"
        )


class DaemonUnresponsive(DshClientError):
    """The socket accepts but ``initialize`` got no answer in time (dshd overloaded, or out of
    file descriptors: the kernel queued the connection and the daemon never reads it)."""

    def __init__(self, path: str | os.PathLike[str], timeout: float) -> None:
        self.path = Path(path)
        super().__init__(
            f"dshd at {self.path} did not answer initialize within {timeout:g} s; it may be "
            "overloaded or out of file descriptors (see its log)"
        )


class CallLost(ConnectionLost):
    """The connection ended while a call was followed: ``hint`` says how to learn its fate."""

    def __init__(self, lost: BaseException, session_id: str, call_id: str) -> None:
        super().__init__(str(lost))
        self.hint = (f"after restarting dshd, `dsh wait {session_id} {call_id}` shows what "
                     "became of the call")


class DaemonGone(ConnectionLost):
    """dshd went away and did not come back within the reconnect timeout (``client.link``)."""

    def __init__(self, timeout: float, why: str, waited: float | None = None,
                 shared_after_s: float = 5.0) -> None:
        """``timeout``: ``--reconnect-timeout``; ``waited``: this outage's budget when it was
        what was left of an earlier outage's (they began less than ``shared_after_s`` apart)."""
        self.timeout = timeout
        self.waited = timeout if waited is None else waited
        if f"{self.waited:.0f}" == f"{timeout:.0f}":
            budget = f"{timeout:g} s (--reconnect-timeout; "
        else:
            budget = (f"{self.waited:.0f} s (what was left of --reconnect-timeout {timeout:g} s: "
                      f"outages less than {shared_after_s:g} s apart share it; ")
        super().__init__(f"dshd did not come back within {budget}last attempt: {why})")


def connect_timeout() -> float:
    """``$DSH_CONNECT_TIMEOUT`` (seconds, > 0) when valid, else ``CONNECT_TIMEOUT_S``."""
    raw = os.environ.get("DSH_CONNECT_TIMEOUT", "")
    try:
        value = float(raw)
    except ValueError:
        return CONNECT_TIMEOUT_S
    return value if 0 < value < math.inf else CONNECT_TIMEOUT_S


class ConnectFailed(DshClientError):
    """The socket exists but could not be connected to for another reason (e.g. permissions)."""


class BadAnswer(DshClientError):
    """dshd answered with a result (or an event) that does not have its protocol shape."""


class _Seq(msgspec.Struct):
    seq: int


_seq_decoder = msgspec.json.Decoder(_Seq)


def dsh_version() -> str:
    """This client's version (``client.__version__``: the installed ``dsh`` distribution's,
    held equal to it by a test; reading the distribution's metadata costs every start ~50 ms)."""
    return client.__version__


class Client:
    """An initialized connection to dshd. Get one from ``connect``."""

    def __init__(self, conn: Connection, path: Path,
                 server: m.InitializeResult | None = None) -> None:
        self._conn = conn
        self.socket_path = path
        #: The ``initialize`` result (None until it came): protocol version, server, sandbox,
        #: tools, methods, capabilities.
        self.server: m.InitializeResult | None = server

    @property
    def connection(self) -> Connection:
        return self._conn

    async def request(self, method: str, params: msgspec.Struct | None = None, *,
                      on_result: Callable[[Any], None] | None = None) -> Any:
        """Send one request and return its result (``RpcError`` for an error answer).

        The one path of every request this client sends (module doc): ``params`` is the
        method's params struct (``protocol.methods.METHODS[method].params``); its fields that
        are None are left out (to the daemon's struct a missing field and ``null`` are the
        same). The result is decoded into ``METHODS[method].result``; a result that does not
        fit it is ``BadAnswer``. ``on_result`` runs in the reader with the decoded result as
        the answer arrives (``Connection.call``).
        """
        entry = m.METHODS.get(method)
        if entry is not None and params is not None and not isinstance(params, entry.params):
            raise TypeError(f"{method} takes {entry.params.__name__}, not "
                            f"{type(params).__name__}")
        wire = {} if params is None else {
            k: v for k, v in msgspec.to_builtins(params).items() if v is not None}
        result_type = Any if entry is None else entry.result
        try:
            return await self._conn.call(method, wire, result_type=result_type,
                                         on_result=on_result)
        except msgspec.ValidationError as exc:
            raise BadAnswer(f"dshd answered {method} with a result this client cannot read: "
                            f"{exc}") from None

    async def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """Any method by name with plain JSON params; its result as plain JSON (for methods
        this client has no wrapper for, and for scripts that speak the wire's JSON)."""
        return await self._conn.call(method, dict(params or {}))

    async def initialize(self, client_name: str, client_version: str | None,
                         approvals: bool) -> m.InitializeResult:
        """``initialize`` (PROTOCOL.md §2); keeps and returns the server's answer."""
        self.server = await self.request("initialize", m.InitializeParams(
            protocol_version=PROTOCOL_VERSION,
            client=m.ClientInfo(name=client_name, version=client_version or dsh_version()),
            capabilities=m.ClientCapabilities(approvals=approvals),
        ))
        return self.server

    # -- sessions ------------------------------------------------------------------------
    async def create_session(self, cwd: str | os.PathLike[str], title: str | None = None, *,
                             sandbox: str | None = None, approval_policy: str | None = None,
                             env: dict[str, str] | None = None,
                             name: str | None = None) -> str:
        """``session.create``. ``sandbox`` (``read-only`` | ``workspace-write`` |
        ``danger-full-access``) and ``approval_policy`` (``ask`` | ``never``) default to the
        daemon's config when None; ``name`` (unique per owner) is taken or ``NAME_TAKEN``.
        Returns the new session id."""
        params = m.SessionCreateParams(cwd=os.fspath(cwd), title=title, sandbox=sandbox,
                                       approval_policy=approval_policy, env=env, name=name)
        result: m.SessionCreateResult = await self.request("session.create", params)
        return result.session_id

    async def find_session(self, ref: str | None, cwd: str | os.PathLike[str] | None = None
                           ) -> tuple[str, str]:
        """``session.find``: ``(session id, how)`` -- ``how`` is ``id``, ``name``,
        ``prefix`` or ``newest-in-cwd`` (``ref`` None: the newest session of ``cwd``)."""
        session_id, how, _ = await self.find_session_named(ref, cwd)
        return session_id, how

    async def find_session_named(self, ref: str | None,
                                 cwd: str | os.PathLike[str] | None = None,
                                 running: bool = False) -> tuple[str, str, str | None]:
        """``find_session`` with the session's name (None: it has none); ``running``: with
        no ``ref``, prefer the newest session of ``cwd`` with a running call or turn."""
        result: m.SessionFindResult = await self.request("session.find", m.SessionFindParams(
            ref=ref, cwd=None if cwd is None else os.fspath(cwd), running=running or None))
        return result.session_id, result.how, result.name

    async def rename_session(self, session_id: str, name: str | None) -> None:
        """``session.rename``: give the session ``name`` (None clears it)."""
        await self.request("session.rename",
                           m.SessionRenameParams(session_id=session_id, name=name))

    async def list_sessions(self) -> list[m.SessionInfo]:
        result: m.SessionListResult = await self.request("session.list", m.EmptyParams())
        return result.sessions

    async def get_session(self, session_id: str) -> m.SessionInfo:
        return await self.request("session.get", m.SessionGetParams(session_id=session_id))

    async def events(self, session_id: str, after_seq: int = -1,
                     limit: int = 1000) -> m.SessionEventsResult:
        """One page of ``session.events``: ``events`` (raw JSON records) and ``last_seq``."""
        return await self.request("session.events", m.SessionEventsParams(
            session_id=session_id, after_seq=after_seq, limit=limit))

    async def iter_records(self, session_id: str, after_seq: int = -1,
                           page_size: int = 1000) -> AsyncIterator[msgspec.Raw]:
        """Every event after ``after_seq`` as its raw JSON record, oldest first, page by page,
        up to the ``lastSeq`` the daemon reported when the walk reached it."""
        while True:
            page = await self.events(session_id, after_seq, page_size)
            for raw in page.events:
                yield raw
            if not page.events:
                return
            last = _seq_decoder.decode(page.events[-1]).seq
            if last >= page.last_seq:
                return
            after_seq = last

    async def iter_events(self, session_id: str, after_seq: int = -1,
                          page_size: int = 1000) -> AsyncIterator[events.AnyEvent]:
        """``iter_records``, each decoded with ``protocol.events`` (an unknown type is an
        ``UnknownEvent``; a known type of the wrong shape is ``BadAnswer``)."""
        async for raw in self.iter_records(session_id, after_seq, page_size):
            try:
                yield events.decode_event(raw)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise BadAnswer(f"dshd sent an event this client cannot read: {exc}") from None

    async def set_policy(self, session_id: str, policy: str) -> None:
        """``session.setApprovalPolicy`` (``ask`` | ``never``)."""
        await self.request("session.setApprovalPolicy",
                           m.SetApprovalPolicyParams(session_id=session_id, policy=policy))

    async def set_sandbox(self, session_id: str, sandbox: str) -> None:
        """``session.setSandbox``: the sandbox mode of the session's calls from now on."""
        await self.request("session.setSandbox",
                           m.SetSandboxParams(session_id=session_id, sandbox=sandbox))

    # -- tools ---------------------------------------------------------------------------
    async def run_tool(self, session_id: str, command: str, *, call_id: str | None = None,
                       timeout: float | None = None, approved: bool = True,
                       name: str = "bash") -> str:
        """``tool.run`` of the bash tool; returns the callId (the existing one when
        ``call_id`` names a call already in the session)."""
        result = await self.start_tool(session_id, command, call_id=call_id, timeout=timeout,
                                       approved=approved, name=name)
        return result.call_id

    async def start_tool(self, session_id: str, command: str, *, call_id: str | None = None,
                         timeout: float | None = None, approved: bool = True,
                         name: str = "bash", tty: tuple[int, int] | None = None,
                         stdin: bool = False, ask_timeout: float | None = None,
                         env: dict[str, str] | None = None) -> m.ToolRunResult:
        """``tool.run`` of the bash tool; ``existing`` is true when ``call_id`` names a call
        already in the session (nothing was run again). ``tty``: (cols, rows) of the PTY the
        command runs under; ``stdin``: the call takes input (``tool.write``) on a pipe;
        ``env``: variables for this call, over the session's env."""
        arguments: dict[str, Any] = {"command": command}
        if env:
            arguments["env"] = dict(env)
        if timeout is not None:
            arguments["timeout"] = timeout
        if tty is not None:
            arguments.update(tty=True, cols=tty[0], rows=tty[1])
        elif stdin:
            arguments["stdin"] = "pipe"
        return await self.request("tool.run", m.ToolRunParams(
            session_id=session_id, name=name, arguments=arguments, call_id=call_id,
            approved=approved, ask_timeout=ask_timeout))

    async def wait(self, session_id: str, call_id: str,
                   timeout: float | None = None) -> m.ToolResult:
        """``tool.wait``: the ToolResult once durable. With ``timeout`` the daemon answers
        ``-32010`` when it passes (and the call keeps running)."""
        return await self.request("tool.wait", m.ToolWaitParams(
            session_id=session_id, call_id=call_id, timeout=timeout))

    async def cancel(self, session_id: str, call_id: str) -> bool:
        result: m.CancelledResult = await self.request(
            "tool.cancel", m.ToolCancelParams(session_id=session_id, call_id=call_id))
        return result.cancelled

    # -- the raw channel (HOST.md §6) ------------------------------------------------------
    async def read_output(self, session_id: str, call_id: str, offset: int,
                          limit: int | None = None, *, from_first: bool = False) -> ReadResult:
        """``tool.read``: up to ``limit`` raw bytes at ``offset``. ``from_first``: an offset
        the disk cap dropped already reads from ``firstOffset`` instead of failing."""

        def params(at: int) -> m.ToolReadParams:
            if limit is None:
                return m.ToolReadParams(session_id=session_id, call_id=call_id, offset=at)
            return m.ToolReadParams(session_id=session_id, call_id=call_id, offset=at,
                                    limit=limit)

        try:
            return await self.request("tool.read", params(offset))
        except RpcError as exc:
            first = exc.data.get("firstOffset") if isinstance(exc.data, dict) else None
            if not from_first or not isinstance(first, int) or first <= offset:
                raise
        return await self.request("tool.read", params(first))

    async def follow_output(self, session_id: str, call_id: str,
                            offset: int = 0) -> OutputFollow:
        """``tool.follow`` from ``offset``; iterate the answer, ``aclose`` it when done."""
        return await OutputFollow(self, session_id, call_id, offset).open()

    async def write_input(self, session_id: str, call_id: str, data: bytes) -> int:
        """``tool.write``: answered once the command's stdin took every byte (≤ 1 MiB)."""
        result: m.ToolWriteResult = await self.request("tool.write", m.ToolWriteParams(
            session_id=session_id, call_id=call_id, data=data))
        return result.written

    async def close_input(self, session_id: str, call_id: str) -> None:
        """``tool.closeStdin``: end of input (a PTY gets its VEOF character)."""
        await self.request("tool.closeStdin",
                           m.ToolCallParams(session_id=session_id, call_id=call_id))

    async def resize(self, session_id: str, call_id: str, cols: int, rows: int) -> None:
        """``tool.resize`` of a tty call's terminal (1..10000 each)."""
        await self.request("tool.resize", m.ToolResizeParams(
            session_id=session_id, call_id=call_id, cols=cols, rows=rows))

    async def send_signal(self, session_id: str, call_id: str, name: str) -> None:
        """``tool.signal`` (``INT``, ``TERM``, ... without ``SIG``) to the command."""
        await self.request("tool.signal", m.ToolSignalParams(
            session_id=session_id, call_id=call_id, signal=name))

    # -- approvals (PROTOCOL.md §3.4) -------------------------------------------------------
    async def decide(self, session_id: str, approval_id: str, decision: str) -> str:
        """``approval.decide`` (``decision``: ``allow`` | ``allow-once`` | ``reject``); returns
        the outcome (``allowed-once`` | ``rejected``). A request decided already is
        ``RpcError`` -32011 with ``data["outcome"]``; an unknown one -32007."""
        return (await self.decide_full(session_id, approval_id, decision)).outcome

    async def decide_full(self, session_id: str, approval_id: str, decision: str,
                          rule: tuple[str, str] | None = None) -> m.ApprovalDecideResult:
        """``approval.decide``, any decision; ``rule``: ``(kind, command)`` of an
        ``allow-for-session`` (None: an exact rule of the call's command)."""
        spec = None if rule is None else ApprovalRuleSpec(kind=rule[0], command=rule[1])  # type: ignore[arg-type]
        return await self.request("approval.decide", m.ApprovalDecideParams(
            session_id=session_id, approval_id=approval_id, decision=decision, rule=spec))

    async def approvals(self) -> list[PendingApproval]:
        """``approval.list``: pending requests over the sessions we may use, oldest first."""
        return (await self.request("approval.list", m.EmptyParams())).approvals

    async def rules(self, session_id: str) -> list[ApprovalRule]:
        """``approval.rules``: the session's live approval rules."""
        return (await self.request("approval.rules", ApprovalRulesParams(
            session_id=session_id))).rules

    async def revoke_rule(self, session_id: str, rule_id: str) -> None:
        """``approval.revokeRule``."""
        await self.request("approval.revokeRule", RevokeRuleParams(
            session_id=session_id, rule_id=rule_id))

    # -- turns (PROTOCOL.md §3.5) ----------------------------------------------------------
    async def start_turn(self, session_id: str, text: str,
                         ask_timeout: float | None = None) -> str:
        """``turn.start``: the agent loop takes ``text``; returns the turn id. ``ask_timeout``:
        seconds its calls wait for an answerer (None: the daemon's turn_ask_grace_seconds)."""
        result: m.TurnStartResult = await self.request(
            "turn.start", m.TurnStartParams(session_id=session_id, input=text,
                                            ask_timeout=ask_timeout))
        return result.turn_id

    async def cancel_turn(self, session_id: str) -> bool:
        """``turn.cancel``: whether a turn was running."""
        result: m.CancelledResult = await self.request(
            "turn.cancel", m.TurnCancelParams(session_id=session_id))
        return result.cancelled

    async def steer_turn(self, session_id: str, text: str) -> m.TurnSteerResult:
        """``turn.steer``: ``text`` joins the running turn (``queued``)."""
        return await self.request("turn.steer",
                                  m.TurnSteerParams(session_id=session_id, input=text))

    # -- streams and daemon --------------------------------------------------------------
    async def subscribe(self, session_id: str, *, bound: int = DEFAULT_INBOX_BOUND) -> Subscription:
        """Subscribe to the session's lane view; iterate the returned ``Subscription``."""
        sub = Subscription(self._conn, session_id, bound=bound, request=self.request)
        await sub.open()
        return sub

    async def status(self) -> m.DaemonStatus:
        return await self.request("daemon.status", m.EmptyParams())


@asynccontextmanager
async def connect(
    socket_path: str | os.PathLike[str] | None = None,
    client_name: str = "dsh",
    *,
    approvals: bool = False,
    client_version: str | None = None,
) -> AsyncIterator[Client]:
    """Connect to dshd and ``initialize``; the connection closes when the block ends."""
    path = resolve_socket_path(socket_path)
    timeout = connect_timeout()
    deadline = anyio.current_time() + timeout
    try:
        with anyio.fail_after(timeout):
            stream = await anyio.connect_unix(os.fspath(path))
    except TimeoutError:
        raise DaemonUnresponsive(path, timeout) from None
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
        raise DaemonNotRunning(path) from exc
    except OSError as exc:
        raise ConnectFailed(f"cannot connect to dshd at {path}: {exc.strerror or exc}") from exc
    async with open_connection(stream) as conn:
        client = Client(conn, path)
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                await client.initialize(client_name, client_version, approvals)
        except TimeoutError:
            raise DaemonUnresponsive(path, timeout) from None
        yield client
