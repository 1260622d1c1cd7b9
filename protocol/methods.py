"""The methods of the dshd client protocol: params AND result structs, and the one table.

Theory of operation: every method of PROTOCOL.md §2–§3 is one entry of :data:`METHODS`,
``name -> Method(params, result)``; the daemon's dispatcher decodes a request's params into
``params`` and its handler returns a ``result``, and a client encodes ``params`` and decodes
``result`` with the same structs (msgspec's ``asyncio-kv`` pattern), so the wire shape is
written once. The daemon's notifications (:data:`NOTIFICATIONS`) are ``stream`` (a lane
batch, §3.3) and ``output`` (a follower's raw bytes, §3.2, HOST.md §6).

Structs use snake_case attribute names and ``rename="camel"``: the wire names of PROTOCOL.md
(``sessionId``) are msgspec's encoded names, so a validation error names the wire field
(``- at `$.afterSeq```). A field the wire leaves out when it has no value is ``UNSET`` by
default (msgspec omits it); ``None`` is sent as ``null``. Params structs ignore unknown fields
(new fields may be added, PROTOCOL.md intro) and carry the caps of what a request may record
(``MAX_*``: strings count characters, ``arguments`` the bytes of compact JSON); past a cap the
request is ``-32602`` naming the field. What needs the daemon's state (a cwd that exists, a
tool's own argument rule) is the handler's check, not the struct's.

Adding a method: its params and result struct and one :data:`METHODS` entry here, one handler
in ``dshd/handlers/``, one client method. Pure: msgspec and ``protocol`` only.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, NamedTuple

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .errors import OpError
from .ids import ID_PATTERN, RESERVED_IDS
from .lane import ToolResult
from .names import SessionFindParams, SessionFindResult, SessionName, SessionRenameParams
from .ops import check_json_value
from .raw import (
    MAX_OUTPUT_CHUNK_BYTES, MAX_READ_BYTES, MAX_TERMINAL_CELLS, MAX_WRITE_BYTES, OutputGap,
    OutputParams, Signal, ToolCallParams, ToolFollowParams, ToolFollowResult, ToolReadParams,
    ToolReadResult, ToolResizeParams, ToolSignalParams, ToolUnfollowParams, ToolWriteParams,
    ToolWriteResult,
)
from .cleanup import (PruneSkip, SessionDeleteParams, SessionDeleteResult, SessionPruneParams,
                      SessionPruneResult)
from .approvals import (ApprovalDecideParams, ApprovalDecideResult, ApprovalListResult,
                        ApprovalRulesParams, ApprovalRulesResult, RevokeRuleParams)
from .structs import _Params, _Result

__all__ = [
    "MAX_ARGUMENTS_BYTES", "MAX_CWD_CHARS", "MAX_ENV_ENTRIES", "MAX_ENV_NAME_CHARS",
    "MAX_ENV_VALUE_CHARS", "MAX_INPUT_CHARS", "MAX_TITLE_CHARS", "METHODS", "NOTIFICATIONS",
    "PROTOCOL_VERSION",
    "ApprovalDecideParams", "ApprovalDecideResult", "BashArguments", "CancelledResult",
    "ClientCapabilities", "ClientInfo", "DaemonCapabilities", "DaemonStatus", "EmptyParams",
    "EmptyResult", "InitializeParams", "InitializeResult", "Method", "SandboxInfo",
    "ServerInfo", "SessionCreateParams", "SessionCreateResult", "SessionEventsParams",
    "SessionEventsResult", "SessionFindParams", "SessionFindResult", "SessionGetParams",
    "SessionInfo", "SessionListResult", "SessionRenameParams",
    "SetApprovalPolicyParams", "StreamParams", "SubscribeParams", "SubscribeResult",
    "SetSandboxParams", "ToolCancelParams", "ToolResult", "ToolRunParams", "ToolRunResult",
    "ToolWaitParams",
    "TurnCancelParams", "TurnStartParams", "TurnStartResult", "TurnSteerParams",
    "TurnSteerResult", "UnsubscribeParams", "arguments_problem",
    "PruneSkip", "SessionDeleteParams", "SessionDeleteResult", "SessionPruneParams",
    "SessionPruneResult",
    "TurnSteerResult", "UnsubscribeParams", "arguments_problem", "env_problem", "RESERVED_ENV",
    "Env",
    "MAX_OUTPUT_CHUNK_BYTES", "MAX_READ_BYTES", "MAX_TERMINAL_CELLS", "MAX_WRITE_BYTES",
    "OutputGap", "OutputParams", "Signal", "ToolCallParams", "ToolFollowParams",
    "ToolFollowResult", "ToolReadParams", "ToolReadResult", "ToolResizeParams",
    "ToolSignalParams", "ToolUnfollowParams", "ToolWriteParams", "ToolWriteResult",
]

PROTOCOL_VERSION = 1

# Caps on what a request may record or have shown (PROTOCOL.md §3.1, §3.2).
MAX_TITLE_CHARS = 1024
MAX_CWD_CHARS = 4096
MAX_ENV_ENTRIES = 256
MAX_ENV_NAME_CHARS = 256
MAX_ENV_VALUE_CHARS = 32 * 1024
MAX_INPUT_CHARS = 1024 * 1024
MAX_ARGUMENTS_BYTES = 8 * 1024 * 1024
#: ``bash``'s ``timeout`` cap: 7 days in seconds (PROTOCOL.md §3.2).
MAX_BASH_TIMEOUT_SECONDS = 7 * 86400
#: ``tool.run``'s ``askTimeout`` cap: one hour in seconds (PROTOCOL.md §3.4).
MAX_ASK_TIMEOUT_SECONDS = 3600
#: Largest terminal width or height of a tty call (HOST.md §5).
MAX_TTY_SIZE = 10_000

_arguments_encoder = msgspec.json.Encoder()

#: A tool environment's names: shell names (EXEC.md §1).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Names dshd puts in every tool's environment; neither a session's nor a call's env may set
#: them (EXEC.md §1).
RESERVED_ENV = frozenset({"DSH_CALL_ID", "DSH_SESSION_ID", "DSH_RUN"})
#: An env as a request carries it (session.create's ``env``, bash's ``arguments.env``): at
#: most 256 entries, names ≤ 256 chars, values ≤ 32,768 chars.
Env = Annotated[
    dict[Annotated[str, Meta(max_length=MAX_ENV_NAME_CHARS)],
         Annotated[str, Meta(max_length=MAX_ENV_VALUE_CHARS)]],
    Meta(max_length=MAX_ENV_ENTRIES),
]


def env_problem(env: dict[str, str], field: str = "env") -> str | None:
    """What is wrong with an env's names and values (beyond ``Env``'s caps), or None: names
    are shell names, values have no NUL, none of :data:`RESERVED_ENV`. The one rule of a
    session's env and a call's."""
    for key, value in env.items():
        if not ENV_NAME.fullmatch(key) or "\0" in value:
            return (f"{field} has an invalid entry {key!r}: names are shell names "
                    "([A-Za-z_][A-Za-z0-9_]*), values have no NUL")
        if key in RESERVED_ENV:
            return (f"{field} may not set {key!r}: dshd sets DSH_CALL_ID, DSH_SESSION_ID and "
                    "DSH_RUN itself (they mark a call and its processes)")
    return None


def arguments_problem(arguments: Any) -> str | None:
    """What is wrong with a tool call's ``arguments`` as a recorded value, or None.

    The one check of both a client's ``tool.run`` and a model's proposed call: an object
    whose every value is a JSON value (OPS.md §1: ints within ±(2^53-1), finite floats, no
    lone surrogates, checked iteratively), at most ``MAX_ARGUMENTS_BYTES`` encoded.
    """
    if type(arguments) is not dict:
        return "arguments must be a JSON object"
    try:
        check_json_value(arguments)
    except OpError as exc:
        return f"arguments: {exc.detail} (OPS.md §1)"
    size = len(_arguments_encoder.encode(arguments))
    if size > MAX_ARGUMENTS_BYTES:
        return (f"arguments are {size} bytes as JSON, more than the cap of "
                f"{MAX_ARGUMENTS_BYTES} bytes (8 MiB); write large content to a file in steps")
    return None


ClientCallId = Annotated[str, Meta(pattern=ID_PATTERN)]
Seconds = Annotated[float, Meta(ge=0)]
ApprovalPolicy = Literal["ask", "never"]
SandboxMode = Literal["read-only", "workspace-write", "danger-full-access"]
Input = Annotated[str, Meta(max_length=MAX_INPUT_CHARS)]


# ---------------------------------------------------------------------- initialize (§2)
class ClientInfo(_Params):
    """``initialize.client``."""

    name: str | UnsetType = UNSET
    version: str | UnsetType = UNSET


class ClientCapabilities(_Params):
    """``initialize.capabilities``; ``approvals`` makes the connection an approval answerer
    (§3.4)."""

    approvals: bool = False


class InitializeParams(_Params):
    """``initialize`` (§2). Unsupported ``protocolVersion`` is the daemon's ``-32003``."""

    protocol_version: int
    client: ClientInfo | None = None
    capabilities: ClientCapabilities | None = None


class ServerInfo(_Result):
    name: str
    version: str


class SandboxInfo(_Result):
    provider: str
    completeness: str


class DaemonCapabilities(_Result):
    """What this daemon can do beyond the methods it lists: ``approvals``, it takes the
    approval-answerer role of §3.4 (``capabilities.approvals`` in ``initialize``)."""

    approvals: bool = True


class InitializeResult(_Result):
    """``tools``: the built-in tools; ``methods``: every method this daemon answers;
    ``capabilities``: what else it supports (a client degrades on an older daemon). This
    daemon always sends all three; an older one sent none, so a client reads them as empty
    lists and the default capabilities when they are missing."""

    protocol_version: int
    server: ServerInfo
    sandbox: SandboxInfo
    tools: list[str] = msgspec.field(default_factory=list)
    methods: list[str] = msgspec.field(default_factory=list)
    capabilities: DaemonCapabilities = msgspec.field(default_factory=DaemonCapabilities)


class EmptyParams(_Params):
    """Methods without params (``session.list``, ``daemon.status``); any fields are ignored."""


class EmptyResult(_Result):
    """``{}``."""


class DaemonStatus(_Result):
    """``daemon.status``; ``sandbox`` is the probe's full description."""

    version: str
    pid: int
    started_at: Any
    sessions_open: int
    connections: int
    subscriptions: int
    dropped_batches: int
    sandbox: dict[str, Any]
    state_dir: str


# ---------------------------------------------------------------------- sessions (§3.1)
class SessionCreateParams(_Params):
    """``session.create``; ``cwd`` must be absolute (existence is the daemon's check).

    Caps: ``cwd`` ≤ 4,096 chars, ``title`` ≤ 1,024, ``env`` ≤ 256 entries, names ≤ 256 chars,
    values ≤ 32,768 chars; ``name`` is a session name (``protocol.names``)."""

    cwd: Annotated[str, Meta(pattern="^/", max_length=MAX_CWD_CHARS)]
    title: Annotated[str, Meta(max_length=MAX_TITLE_CHARS)] | None = None
    approval_policy: ApprovalPolicy | None = None
    sandbox: SandboxMode | None = None
    env: Env | None = None
    name: SessionName | None = None


class SessionCreateResult(_Result):
    session_id: str


class SessionInfo(_Result):
    """SessionInfo (§3.1). A session whose log cannot be read has ``sessionId`` and
    ``damaged`` (the reason) only; one dshd could not look at now (out of file descriptors)
    has ``sessionId`` and ``unreadable`` (the reason) only."""

    session_id: str
    title: str | None | UnsetType = UNSET
    cwd: str | UnsetType = UNSET
    created_at: int | None | UnsetType = UNSET
    approval_policy: str | UnsetType = UNSET
    sandbox: str | UnsetType = UNSET
    running: int | UnsetType = UNSET
    last_seq: int | UnsetType = UNSET
    owner: int | None | UnsetType = UNSET
    name: str | None | UnsetType = UNSET
    updated_at: int | None | UnsetType = UNSET
    pending_approvals: int | UnsetType = UNSET
    last_exit: int | str | None | UnsetType = UNSET
    damaged: str | UnsetType = UNSET
    unreadable: str | UnsetType = UNSET


class SessionListResult(_Result):
    sessions: list[SessionInfo]


class SessionGetParams(_Params):
    session_id: str


class SessionEventsParams(_Params):
    """``session.events``: events with ``seq > afterSeq``, at most ``limit`` (≤ 10,000)."""

    session_id: str
    after_seq: Annotated[int, Meta(ge=-1)] = -1
    limit: Annotated[int, Meta(ge=0, le=10_000)] = 1000


class SessionEventsResult(_Result):
    """``events``: log records (STORAGE.md §3) as raw JSON; ``protocol.events.decode_events``
    types them (an event type this client does not know stays readable)."""

    events: list[msgspec.Raw]
    last_seq: int


class SetApprovalPolicyParams(_Params):
    session_id: str
    policy: ApprovalPolicy


class SetSandboxParams(_Params):
    """``session.setSandbox``: the sandbox mode of the session's calls from now on."""

    session_id: str
    sandbox: SandboxMode


# ---------------------------------------------------------------------- tools (§3.2)
class ToolRunParams(_Params):
    """``tool.run``. ``callId``, when given, matches ``protocol.ids`` and is not reserved;
    ``approved`` means the caller is the person approving this call. ``arguments`` must pass
    ``arguments_problem`` (JSON values only, ≤ 8 MiB encoded); the tool's own rule is the
    daemon's tool registry's (``dshd.tools``)."""

    session_id: str
    name: str
    arguments: dict[str, Any]
    call_id: ClientCallId | None = None
    approved: bool = False
    #: Seconds the gate waits for an answerer to attach (or a decision) before
    #: ``unavailable`` (PROTOCOL.md §3.4); None: at once.
    ask_timeout: Annotated[float, Meta(ge=0, le=MAX_ASK_TIMEOUT_SECONDS)] | None = None

    def __post_init__(self) -> None:
        if self.call_id in RESERVED_IDS:
            raise ValueError(f"callId {self.call_id!r} is reserved - at `$.callId`")
        problem = arguments_problem(self.arguments)
        if problem is not None:
            raise ValueError(f"{problem} - at `$.arguments`")


class ToolRunResult(_Result, omit_defaults=True):
    """``existing`` is sent only when true (the call id was already known)."""

    call_id: str
    existing: bool = False


class BashArguments(msgspec.Struct, frozen=True, kw_only=True):
    """``arguments`` of the built-in ``bash`` tool, for a client and a model alike (§3.2):
    ``command`` a non-empty string without NUL, ``timeout`` seconds > 0 and ≤ 604,800; other
    keys are ignored. ``tty`` (a PTY of ``cols`` x ``rows``, 1..10000 each) and ``stdin``
    (``"pipe"``: written with ``tool.write``) shape the command's terminal and input (HOST.md
    §5). ``env`` (``Env``'s caps and ``env_problem``'s rule, as ``session.create``'s) is set
    over the session's env for this call only (EXEC.md §1). Its JSON schema is what the model
    is shown."""

    command: Annotated[str, Meta(min_length=1, description="The command line, run as `bash -c`.")]
    timeout: Annotated[float, Meta(
        gt=0, le=MAX_BASH_TIMEOUT_SECONDS,
        description="Seconds before the command's process group is killed.",
    )] | None = None
    tty: Annotated[bool, Meta(
        description="Run under a terminal (PTY) of cols x rows; stdin is the terminal.",
    )] = False
    cols: Annotated[int, Meta(ge=1, le=MAX_TTY_SIZE, description="Terminal width (tty).")] = 80
    rows: Annotated[int, Meta(ge=1, le=MAX_TTY_SIZE, description="Terminal height (tty).")] = 24
    stdin: Annotated[Literal["null", "pipe"], Meta(
        description='"pipe": stdin is written with tool.write; "null": empty.',
    )] = "null"
    env: Annotated[Env, Meta(
        description="Environment variables for this command, over the session's env.",
    )] | None = None

    def __post_init__(self) -> None:
        if "\0" in self.command:
            raise ValueError("arguments.command must not contain a NUL character (a shell "
                             "cannot run one) - at `$.command`")
        problem = env_problem(self.env or {}, "arguments.env")
        if problem is not None:
            raise ValueError(f"{problem} - at `$.env`")


class ToolWaitParams(_Params):
    """``tool.wait``; ``timeout`` in seconds (None: wait until the result is durable)."""

    session_id: str
    call_id: str
    timeout: Seconds | None = None


class ToolCancelParams(_Params):
    session_id: str
    call_id: str


class CancelledResult(_Result):
    """``tool.cancel`` and ``turn.cancel``: whether there was something to cancel."""

    cancelled: bool


# ---------------------------------------------------------------------- streams (§3.3)
class SubscribeParams(_Params):
    session_id: str


class SubscribeResult(_Result):
    subscription_id: str


class UnsubscribeParams(_Params):
    subscription_id: str


class StreamParams(_Params):
    """The ``stream`` notification: ``ops`` is a wire batch (OPS.md §3)."""

    subscription_id: str
    seq: Annotated[int, Meta(ge=0)]
    ops: list[Any]


# ---------------------------------------------------------------------- approvals (§3.4)
# ``protocol.approvals``: approval.decide, approval.rules, approval.revokeRule, approval.list.


# ---------------------------------------------------------------------- turns (§3.5)
class TurnStartParams(_Params):
    """``turn.start``: ``input`` ≤ 1,048,576 chars (as ``turn.steer``)."""

    session_id: str
    input: Input
    #: Seconds a call of this turn waits for an answerer (PROTOCOL.md §3.4's one rule);
    #: None: ``turn_ask_grace_seconds``; 0: at once (a chat that knows nobody can answer).
    ask_timeout: Annotated[float, Meta(ge=0, le=MAX_ASK_TIMEOUT_SECONDS)] | None = None


class TurnStartResult(_Result):
    turn_id: str


class TurnCancelParams(_Params):
    session_id: str


class TurnSteerParams(_Params):
    session_id: str
    input: Input


class TurnSteerResult(_Result):
    turn_id: str
    queued: bool = True


# -- room cleanup (issue 15): deleting and pruning sessions (PROTOCOL.md §3.1) -------------
class Method(NamedTuple):
    """One method: the struct its params decode into and the struct its result is."""

    params: type
    result: Any


#: Method name -> (params, result): PROTOCOL.md §2–§3, the one table of the protocol.
METHODS: dict[str, Method] = {
    "initialize": Method(InitializeParams, InitializeResult),
    "daemon.status": Method(EmptyParams, DaemonStatus),
    "session.create": Method(SessionCreateParams, SessionCreateResult),
    "session.list": Method(EmptyParams, SessionListResult),
    "session.get": Method(SessionGetParams, SessionInfo),
    "session.events": Method(SessionEventsParams, SessionEventsResult),
    "session.setApprovalPolicy": Method(SetApprovalPolicyParams, EmptyResult),
    "session.find": Method(SessionFindParams, SessionFindResult),
    "session.rename": Method(SessionRenameParams, EmptyResult),
    "session.delete": Method(SessionDeleteParams, SessionDeleteResult),
    "session.prune": Method(SessionPruneParams, SessionPruneResult),
    "session.setSandbox": Method(SetSandboxParams, EmptyResult),
    "tool.run": Method(ToolRunParams, ToolRunResult),
    "tool.wait": Method(ToolWaitParams, ToolResult),
    "tool.cancel": Method(ToolCancelParams, CancelledResult),
    "tool.read": Method(ToolReadParams, ToolReadResult),
    "tool.follow": Method(ToolFollowParams, ToolFollowResult),
    "tool.unfollow": Method(ToolUnfollowParams, EmptyResult),
    "tool.write": Method(ToolWriteParams, ToolWriteResult),
    "tool.closeStdin": Method(ToolCallParams, EmptyResult),
    "tool.resize": Method(ToolResizeParams, EmptyResult),
    "tool.signal": Method(ToolSignalParams, EmptyResult),
    "subscribe": Method(SubscribeParams, SubscribeResult),
    "unsubscribe": Method(UnsubscribeParams, EmptyResult),
    "approval.decide": Method(ApprovalDecideParams, ApprovalDecideResult),
    "approval.rules": Method(ApprovalRulesParams, ApprovalRulesResult),
    "approval.revokeRule": Method(RevokeRuleParams, EmptyResult),
    "approval.list": Method(EmptyParams, ApprovalListResult),
    "turn.start": Method(TurnStartParams, TurnStartResult),
    "turn.cancel": Method(TurnCancelParams, CancelledResult),
    "turn.steer": Method(TurnSteerParams, TurnSteerResult),
}

#: Notifications the daemon sends: name -> params struct (§3.3).
NOTIFICATIONS: dict[str, type] = {"stream": StreamParams, "output": OutputParams}
