"""Daemon configuration: one msgspec struct, built once at start and passed down.

Theory of operation: every setting has an embedded default, so ``dshd`` runs with no config
file at all. A TOML file (``dshd --config PATH``, else ``$XDG_CONFIG_HOME/dsh/dshd.toml`` in
user mode or ``/etc/dsh/dshd.toml`` in system mode, when present) is read with ``tomllib`` and
converted with msgspec; an unknown key is an error that names the key. Command-line flags
override the file. Paths (``socket``, ``state_dir``) are made absolute at load: a relative one
in the file is relative to the file's directory, on the command line to the working directory.
Units are in the field names' comments: bytes, seconds, counts.

Reload (SIGHUP, ``systemctl reload dshd``; ``dshd.service``): the daemon rebuilds a Config from
the same file and flags as at start and :func:`apply_reload` copies every field that differs
into the one Config the daemon shares (it is mutated in place, on the event loop, so every
object that holds it sees the new value on its next read). Every field is reloadable by
default (a field added later is too) except :data:`RELOAD_REFUSED`: those are bound at start
(the listening socket, the state directory and its lock, the system-mode socket group, the
probed sandbox). A change to one of them is refused *alone*: the key is named in a log line and
keeps its old value, and the other changes apply. A file that does not load changes nothing.
What a value governs decides when a reload shows: limits and policies read per request or per
call (``max_sessions``, ``max_requests_per_connection``, the output window, grace times,
``network``, ``[model]`` per turn) apply at once; session defaults (``approval_policy``,
``sandbox``, ``compression``) apply to sessions created afterwards; values an object copies
when it is made (``max_message_bytes`` per connection; ``coalesce_seconds`` and the
``publish_*`` pacing per open session) apply to connections and sessions opened afterwards.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from . import paths


class ConfigError(Exception):
    """The config file is missing, not TOML, or has a key or value dshd does not know."""


class ModelConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The ``[model]`` table: which model the agent loop asks (``dshd.agent``)."""

    #: "scripted" replays canned responses (offline demos, tests); "openai-compatible" streams
    #: chat completions from ``base_url``.
    provider: Literal["scripted", "openai-compatible"] = "scripted"
    #: API root of an openai-compatible endpoint (``{base_url}/chat/completions`` is POSTed).
    base_url: str = "https://api.openai.com/v1"
    model: str = "gpt-4o-mini"
    #: Environment variable of dshd that holds the API key (no key: no Authorization header).
    api_key_env: str = "OPENAI_API_KEY"
    #: JSONL file of canned responses for "scripted"; None: the built-in demo script.
    script: str | None = None
    #: Model requests per turn before the turn ends with an error (a runaway loop stops).
    max_steps: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 8
    #: Connect, and wait between two received stream chunks, seconds.
    request_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 120.0
    #: Retries of one request after 429, 5xx, a transport error or a cut stream.
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=20)] = 4
    #: Backoff between retries: first wait and cap, seconds (a 429's Retry-After is honoured
    #: up to the cap).
    retry_initial_seconds: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    retry_max_seconds: Annotated[float, msgspec.Meta(ge=0)] = 20.0
    #: System prompt; None: a built-in one that describes the session and its bash tool.
    system_prompt: str | None = None


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: System mode: /run/dsh socket (0660, group ``group``), /var/lib/dsh state.
    system: bool = False
    #: Socket path; None resolves per PROTOCOL.md §1.
    socket: str | None = None
    #: State directory; None resolves per STORAGE.md §1.
    state_dir: str | None = None
    #: Group let in on the socket in system mode.
    group: str = "dsh"
    #: Largest accepted request line, bytes (PROTOCOL.md §1).
    max_message_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16 * 1024 * 1024
    #: Default approval policy of new sessions.
    approval_policy: Literal["ask", "never"] = "ask"
    #: Default sandbox mode of new sessions (EXEC.md §3).
    sandbox: Literal["read-only", "workspace-write", "danger-full-access"] = "workspace-write"
    #: Sandbox provider: "auto" (bwrap, else landlock, else none), or force one (EXEC.md §3).
    sandbox_provider: Literal["auto", "bwrap", "landlock", "none"] = "auto"
    #: Let confined tools use the network (workspace-write only; EXEC.md §3).
    network: bool = False
    #: Log compression (STORAGE.md §2).
    compression: Literal["zstd", "none"] = "zstd"
    #: Coalescing window of the event log, seconds (STORAGE.md §4).
    coalesce_seconds: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.200
    # -- room storage (issue 14): snapshots bound open and repair (STORAGE.md §7)
    #: Events between two log/snapshot frames; 0 = never (opens then read the whole log).
    snapshot_every_events: Annotated[int, msgspec.Meta(ge=0, le=10_000_000)] = 10_000
    #: Retained output window per call (EXEC.md §2): UTF-8 bytes and lines.
    output_max_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 51_200
    output_max_lines: Annotated[int, msgspec.Meta(ge=1)] = 2_000
    #: Grace between SIGTERM and SIGKILL, and wait for EOF after exit, seconds (EXEC.md §2).
    kill_grace_seconds: Annotated[float, msgspec.Meta(ge=0, le=600)] = 2.0
    eof_grace_seconds: Annotated[float, msgspec.Meta(ge=0, le=600)] = 2.0
    #: Per-connection send queue: stream bytes queued before a subscription is dropped to
    #: "needs base", and response bytes queued before the connection is closed.
    send_queue_stream_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 4 * 1024 * 1024
    send_queue_response_bytes: Annotated[int, msgspec.Meta(ge=65536)] = 64 * 1024 * 1024
    #: A connection whose queue does not drain for this long is closed, seconds.
    stalled_client_seconds: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    #: Concurrent requests in flight per connection (more get -32013).
    max_requests_per_connection: Annotated[int, msgspec.Meta(ge=1)] = 256
    # -- wire limits (issue 10, connection room): PROTOCOL.md §1 ---------------------------
    #: Entries of one batch array; a longer batch gets one -32600 (id null), none of it runs.
    max_batch_entries: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1_000
    #: Client connections served at once; the next one gets one -32013 line and is closed.
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=65_536)] = 256
    # -- initialize deadline (fix-spawn room): PROTOCOL.md §1 -----------------------------
    #: A connection that has not completed ``initialize`` this long after it was accepted gets
    #: one -32002 line and is closed (it would otherwise hold a ``max_connections`` slot),
    #: seconds.
    initialize_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    #: Bytes of not-yet-complete lines buffered over all connections together; the connection
    #: whose bytes would pass it gets one -32013 line and is closed.
    max_buffered_bytes: Annotated[int, msgspec.Meta(ge=1024 * 1024)] = 64 * 1024 * 1024
    #: A line longer than this is parsed on a worker thread, not on the event loop, bytes.
    offload_parse_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024
    #: Sessions a daemon holds open at once; at the limit the least recently used idle one is
    #: closed to make room, and only when all are busy does a request get -32013.
    max_sessions: Annotated[int, msgspec.Meta(ge=1)] = 1024
    #: A session with no running call and no subscriber is closed after this long, seconds
    #: (reopened transparently on the next request that names it).
    session_idle_seconds: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    #: Publication pacing (EXEC.md §2): minimum interval of paced publishes, seconds; and
    #: (room stream, issue 14) the rate that spaces big batches, encoded wire bytes per second
    #: per subscription (2 MiB/s: 100 calls at 100 lines/s are ~340 KB/s of wire).
    publish_interval_seconds: Annotated[float, msgspec.Meta(gt=0, le=10)] = 0.010
    publish_rate_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 2 * 1024 * 1024
    # --- boundary room (issue 10 item 15): tool calls admitted at once, counts. A call past
    # either limit is refused before anything is recorded: -32013 for a client's tool.run, a
    # LIMIT_EXCEEDED result for a model's call.
    #: Running (unsettled) calls per session.
    max_calls_per_session: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 256
    #: Running calls over the whole daemon (all sessions).
    max_calls: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 1024
    # -- sandbox room (issue 10 item 6; EXEC.md §3) --------------------------------------
    #: Cap of one confined call's private /tmp (bwrap tmpfs, RAM), bytes: 1 MiB .. 1 TiB.
    tmp_size_bytes: Annotated[int, msgspec.Meta(ge=1 << 20, le=1 << 40)] = 512 * 1024 * 1024
    #: Bound on the private tmpfs mounts of all running confined calls together, bytes; each
    #: running call counts its caps (tmp_size_bytes + /dev/shm + /run), so the default allows
    #: 14 at the default tmp_size_bytes. A call past it fails closed (SANDBOX_UNAVAILABLE), it
    #: does not wait. User mode only (system mode: per-call caps only). 1 MiB .. 1 TiB.
    tmp_total_bytes: Annotated[int, msgspec.Meta(ge=1 << 20, le=1 << 40)] = 8 * 1024 * 1024 * 1024
    # -- execution: the tool's environment (issue 10 item 22, EXEC.md §1) --
    #: Daemon environment variables a tool inherits on top of the minimal environment (names;
    #: at most 256). ``DSH_*``, ``LISTEN_*`` and systemd's hand-over variables are refused.
    pass_env: Annotated[
        list[Annotated[str, msgspec.Meta(
            pattern=r"^(?!DSH_|LISTEN_|NOTIFY_SOCKET$|WATCHDOG_USEC$|WATCHDOG_PID$|INVOCATION_ID$)"
                    r"[A-Za-z_][A-Za-z0-9_]{0,127}$")]],
        msgspec.Meta(max_length=256),
    ] = msgspec.field(default_factory=list)
    # -- wire shell room (issue 11): the one stop budget (dshd.daemon.StopBudget) ---------
    #: A graceful stop (SIGTERM, SIGINT) ends within this, seconds: every stop timeout of the
    #: daemon is a share of it; the units' TimeoutStopSec= is it plus a 5 s margin.
    stop_timeout_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 10.0
    # -- runner room (issue 12, HOST.md §3): the call host's per-call log and lifetime ------
    #: Raw output kept on disk per call (output.raw and its segments), bytes: 64 KiB .. 1 TiB;
    #: past it the oldest quarter is dropped (``truncation.droppedBytes``).
    spill_max_bytes: Annotated[int, msgspec.Meta(ge=65_536, le=1 << 40)] = 1_073_741_824
    #: A call host whose command ended waits this long for the daemon to record the result
    #: before it exits on its own, seconds.
    host_linger_seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 300.0
    # -- adopt room (issue 13, HOST.md §7): calls across a daemon restart ------------------
    #: What a daemon stop (SIGTERM, ``make stop``, systemctl) does to running calls: "detach"
    #: leaves their call hosts running (the next start re-adopts them; approvals are asked
    #: again), "cancel" ends them (TOOL_CANCELLED). ``session.delete`` with ``force`` cancels
    #: them whatever this says. Also decides the host's ``on_daemon_loss`` ("keep" / "terminate").
    on_stop: Literal["detach", "cancel"] = "detach"
    #: A re-asked approval (pending across a restart) waits this long for an answerer to
    #: attach before it is ``unavailable``, seconds: 0 .. 86400 (room asks).
    reask_grace_seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 120.0
    # -- fixchat room (issue 15): re-joinable turns (PROTOCOL.md §3.4's one rule) ----------
    #: A model-proposed call's approval with no answerer (none at ask time, or the last one
    #: left) waits this long for one to (re)join before it is ``unavailable``, seconds:
    #: 0 .. 86400 (0: at once, as a ``tool.run`` without ``askTimeout``).
    turn_ask_grace_seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 120.0
    # -- sessions room (issue 14): an open session's bounded memory ------------------------
    #: Settled tool results an open session keeps in memory (an LRU), counts: 1 .. 65536; a
    #: ``tool.wait`` on an older one reads it back from the log by its seq (the lane's
    #: ``recent`` names the last 20; the cache serves the waits that follow a settle).
    results_cache: Annotated[int, msgspec.Meta(ge=1, le=65_536)] = 32
    # -- room cleanup (issue 15): retention (OPS.md "Retention", dshd.sessions.retention) --
    #: Idle sessions not updated for this long are deleted by the daemon, days (float):
    #: 0 = keep forever; 0 .. 36500.
    retain_sessions_days: Annotated[float, msgspec.Meta(ge=0, le=36_500)] = 30.0
    #: Past this size of the state directory (its apparent size, as du -sb counts), settled calls'
    #: raw output is removed oldest first (their logged results stay), bytes: 0 = no bound;
    #: else 1 .. 1 PiB.
    max_state_bytes: Annotated[int, msgspec.Meta(ge=0, le=1 << 50)] = 4 * 1024 * 1024 * 1024
    #: Seconds between two retention passes (one also runs at start): 1 .. 86400.
    retention_interval_seconds: Annotated[float, msgspec.Meta(ge=1, le=86_400)] = 3600.0
    #: Log output: "auto" (console on a TTY, JSON otherwise), "console" or "json".
    log_format: Literal["auto", "console", "json"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # -- room requests (issue 14): the per-request log line ----------------------------------
    #: A request answered without an error in less than this is logged at debug level, not
    #: info (formatting one line per request was most of a cheap request's daemon CPU);
    #: errors and slower requests stay at info. 0 = every request at info. Milliseconds,
    #: 0 .. 3,600,000.
    log_requests_slower_than_ms: Annotated[float, msgspec.Meta(ge=0, le=3_600_000)] = 500.0
    #: The agent loop's model (``[model]`` table; ``ModelConfig``).
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)

    def __post_init__(self) -> None:
        if self.max_buffered_bytes < self.max_message_bytes:
            raise ValueError(
                f"max_buffered_bytes ({self.max_buffered_bytes}) must be at least "
                f"max_message_bytes ({self.max_message_bytes}), or the longest line never fits"
            )

    def socket_path(self) -> Path:
        """Absolute (a relative ``DSH_SOCKET`` is relative to the working directory)."""
        return Path(os.path.abspath(paths.socket_path(self.socket, system=self.system)))

    def state_path(self) -> Path:
        """Absolute (a relative ``DSH_STATE_DIR`` is relative to the working directory)."""
        return Path(os.path.abspath(paths.state_dir(self.state_dir, system=self.system)))


#: Fields bound at start that a reload refuses to change (each refusal is logged by name).
RELOAD_REFUSED = frozenset({"system", "socket", "state_dir", "sandbox_provider", "group"})


class ReloadResult(msgspec.Struct, frozen=True):
    changed: list[str]  # fields that took their new value
    refused: list[str]  # fields in RELOAD_REFUSED whose new value was not applied


def apply_reload(current: Config, new: Config) -> ReloadResult:
    """Copy into ``current`` every field of ``new`` that differs, except those in
    :data:`RELOAD_REFUSED` (they keep their value and are listed as refused)."""
    changed, refused = [], []
    for name in current.__struct_fields__:
        if getattr(current, name) == getattr(new, name):
            continue
        if name in RELOAD_REFUSED:
            refused.append(name)
        else:
            setattr(current, name, getattr(new, name))
            changed.append(name)
    return ReloadResult(changed=changed, refused=refused)


def default_config_path(system: bool) -> Path:
    if system:
        return Path("/etc/dsh/dshd.toml")
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg else Path.home() / ".config"
    return base / "dsh" / "dshd.toml"


#: Config keys that are paths (made absolute at load).
PATH_KEYS = ("socket", "state_dir")


def _absolute(value: str, base: Path) -> str:
    path = Path(value).expanduser()
    return os.path.normpath(path if path.is_absolute() else base / path) if value else value


def load_config(path: str | os.PathLike[str] | None, *, system: bool = False, **overrides) -> Config:
    """Build the Config: defaults < TOML file < ``overrides`` (flags; None values ignored).

    ``path`` given and missing is an error; the default path is read only when it exists.
    Raises ConfigError with the file and the offending key or value.
    """
    data: dict = {}
    explicit = path is not None
    file = Path(os.path.abspath(path)) if explicit else default_config_path(system)
    if explicit or file.exists():
        try:
            with open(file, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {file} does not exist") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"config file {file} cannot be read: {exc.strerror}") from None
    if system:
        data["system"] = True
    # Relative paths in the file are relative to the file; on the command line, to the cwd.
    # Resolved here, once: the daemon hands them to sandboxes and subprocesses.
    for key in PATH_KEYS:
        if isinstance(data.get(key), str):
            data[key] = _absolute(data[key], file.parent)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    for key in PATH_KEYS:
        if isinstance(overrides.get(key), str):
            overrides[key] = _absolute(overrides[key], Path.cwd())
    data.update(overrides)
    try:
        return msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"config file {file}: {exc}") from None
