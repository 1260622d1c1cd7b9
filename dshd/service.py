"""dshd as a systemd service: notify messages, the watchdog, STATUS= lines and reload
(sd_notify(3), systemd.service(5)).

Theory of operation: one :class:`ServiceMonitor` per daemon, a task in the daemon's outer
nursery, talks to systemd through one :class:`Notifier` (a datagram socket connected to
``$NOTIFY_SOCKET``; with no such variable every send is a no-op, so the same code runs under
systemd, under ``systemd-socket-activate`` and in a terminal).

- **Watchdog.** When ``$WATCHDOG_USEC`` is set (and ``$WATCHDOG_PID``, if set, is our pid) the
  monitor wakes every ``WATCHDOG_USEC / 2`` and sends ``WATCHDOG=1`` only if the daemon made
  progress. The event loop's progress is the wake-up itself: a blocked loop cannot run this
  task, so the pings stop by themselves. The session writers' progress is each writer's own
  report (``SessionLog.write_started``: the trio time its write + fsync in flight began, None
  when none is in flight; a write runs in a worker thread, so the loop keeps running while a
  disk hangs). A writer whose write has not returned for longer than the bound (the ping
  interval) is *stuck*: the monitor withholds the ping, logs one ``watchdog.withheld`` line per
  episode naming the session and says so in ``STATUS=``. systemd then kills and restarts the
  daemon after ``WatchdogSec=`` without a ping; if the write returns first, the pings resume.
  Every writer of the daemon is checked, also one finishing its final flush after its session
  was closed (``SessionRegistry.live``).
- **STATUS=.** On every wake-up (every ping interval, else every ``STATUS_SECONDS``) the monitor
  sends ``STATUS=`` with the open sessions, running tool calls and connections, when the text
  changed (``systemctl status`` shows it).
- **Reload (SIGHUP, ``ExecReload=``).** :meth:`ServiceMonitor.reload` sends ``RELOADING=1`` with
  ``MONOTONIC_USEC``, rebuilds the Config from the same file and flags as at start, applies it
  with :func:`dshd.config.apply_reload` (the reloadable fields change in place in the one
  shared Config; each refused field is named in a ``config.reload_refused`` line and keeps its
  old value), reconfigures logging when its fields changed, then sends ``READY=1``. A file
  that does not load changes nothing (``config.reload_failed``), and READY=1 still follows.
- **Stop budget.** A graceful stop ends within ``stop_timeout_seconds`` (``dshd.daemon.
  StopBudget``); the units' ``TimeoutStopSec=`` is its default plus :data:`STOP_MARGIN_SECONDS`
  (:func:`unit_timeout_stop_sec`, rendered by ``systemd/install.sh``), and ``STOPPING=1``
  carries ``EXTEND_TIMEOUT_USEC=`` with the current budget plus the margin
  (:func:`stopping_message`), so a raised key needs no edit of the unit.
"""

from __future__ import annotations

import math
import os
import socket as stdsocket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
import trio

from .config import Config, ConfigError, apply_reload
from .logging import configure

if TYPE_CHECKING:
    from .daemon import Daemon, StopBudget

log = structlog.get_logger("dshd.service")

#: STATUS= refresh period when no watchdog is asked for, seconds.
STATUS_SECONDS = 5.0
#: A writer stuck this long is reported in STATUS= even without a watchdog, seconds.
STUCK_SECONDS_WITHOUT_WATCHDOG = 30.0
#: Longest notify message dshd sends, bytes (systemd reads at most a page per datagram).
MAX_NOTIFY_BYTES = 4096
#: What the service manager allows past ``stop_timeout_seconds`` before it kills dshd: the
#: process's own exit after the graceful stop (listener, lock, interpreter teardown), seconds.
STOP_MARGIN_SECONDS = 5.0


def unit_timeout_stop_sec(config: Config | None = None) -> int:
    """``TimeoutStopSec=`` of the units: ``stop_timeout_seconds`` plus the margin, in whole
    seconds (``systemd/install.sh`` renders it from the default: ``python -m dshd.service``)."""
    total = (config or Config()).stop_timeout_seconds
    return math.ceil(total + STOP_MARGIN_SECONDS)


def stopping_message(budget: StopBudget) -> str:
    """``STOPPING=1`` with this stop's budget plus the margin (``EXTEND_TIMEOUT_USEC=``): a
    ``stop_timeout_seconds`` raised past the unit's ``TimeoutStopSec=`` is honoured too."""
    usec = math.ceil((budget.total + STOP_MARGIN_SECONDS) * 1_000_000)
    return f"STOPPING=1\nEXTEND_TIMEOUT_USEC={usec}"


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in µs: the clock ``MONOTONIC_USEC=`` is read against (sd_notify(3))."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def watchdog_interval(environ: os._Environ | dict[str, str] | None = None,
                      pid: int | None = None) -> float | None:
    """The ping interval in seconds (``WATCHDOG_USEC / 2``), or None when no watchdog is asked
    for us (unset, not a positive integer, or ``WATCHDOG_PID`` names another process)."""
    env = os.environ if environ is None else environ
    owner = env.get("WATCHDOG_PID")
    if owner and owner != str(os.getpid() if pid is None else pid):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2 / 1_000_000 if usec > 0 else None


class Notifier:
    """Sends sd_notify(3) messages to one address (``@name``: abstract namespace)."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self._sock: stdsocket.socket | None = None
        self._failing = False

    @classmethod
    def from_environ(cls) -> Notifier:
        return cls(os.environ.get("NOTIFY_SOCKET") or None)

    def send(self, message: str) -> bool:
        """Send one datagram; False (and one log line per failing episode) when it fails."""
        if not self.address:
            return False
        data = message.encode()[:MAX_NOTIFY_BYTES]
        addr = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._sock is None:
                self._sock = stdsocket.socket(stdsocket.AF_UNIX,
                                              stdsocket.SOCK_DGRAM | stdsocket.SOCK_CLOEXEC)
            self._sock.sendto(data, addr)
        except OSError as exc:
            if not self._failing:
                log.warning("sd_notify.failed", address=self.address, error=str(exc))
            self._failing = True
            return False
        self._failing = False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class ServiceMonitor:
    """Watchdog pings, STATUS= lines and reload for one daemon (see the module docstring).

    ``reload_config`` rebuilds the Config as at start (same file, same flags); None: SIGHUP
    only logs that this daemon cannot reload (an in-process daemon with a hand-made Config).
    """

    def __init__(self, daemon: Daemon, notifier: Notifier, *,
                 reload_config: Callable[[], Config] | None = None,
                 watchdog: float | None = None) -> None:
        self.daemon = daemon
        self.notifier = notifier
        self.reload_config = reload_config
        self.watchdog = watchdog
        self.stuck_bound = watchdog if watchdog is not None else STUCK_SECONDS_WITHOUT_WATCHDOG
        self.pings = 0
        self.withheld: str | None = None  # why the last ping was withheld (None: it was sent)
        self._status = ""

    # ----------------------------------------------------------------- progress
    def stuck_writer(self, now: float) -> str | None:
        """A sentence naming a session writer whose write has been in flight longer than the
        bound, or None when every writer makes progress."""
        for session in self.daemon.registry.live_sessions():
            since = session.write_started()
            if since is not None and now - since > self.stuck_bound:
                return (f"session {session.id}: a log write (fsync) has not returned for "
                        f"{now - since:.1f} s")
        return None

    def status_line(self) -> str:
        d = self.daemon
        sessions = d.registry.open_sessions()
        running = sum(s.running for s in sessions)
        text = (f"{len(sessions)} sessions open, {running} tool calls running, "
                f"{len(d.connections)} connections")
        if self.withheld:
            text += f"; watchdog withheld: {self.withheld}"
        return text

    def _send_status(self, force: bool = False) -> None:
        text = self.status_line()
        if force or text != self._status:
            self._status = text
            self.notifier.send(f"STATUS={text}")

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Ping and refresh STATUS= until cancelled (a task of the daemon's outer nursery)."""
        tick = self.watchdog if self.watchdog is not None else STATUS_SECONDS
        task_status.started()
        while True:
            asked = trio.current_time()
            await trio.sleep(tick)
            now = trio.current_time()
            late = now - asked - tick
            if late > self.stuck_bound:
                log.warning("event_loop.stalled", seconds=round(late, 3))
            reason = self.stuck_writer(now)
            if reason is None:
                if self.withheld is not None:
                    log.info("watchdog.resumed", after=self.withheld)
                self.withheld = None
                if self.watchdog is not None and self.notifier.send("WATCHDOG=1"):
                    self.pings += 1
            elif self.withheld is None:
                self.withheld = reason
                log.error("watchdog.withheld", reason=reason, watchdog=self.watchdog is not None,
                          hint="the disk under the state directory does not answer; systemd "
                               "restarts dshd when WatchdogSec= passes without a ping")
            self._send_status()

    # ----------------------------------------------------------------- reload
    async def reload(self) -> None:
        """SIGHUP: RELOADING=1, re-read the config, apply what may change, READY=1."""
        self.notifier.send(f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}")
        try:
            if self.reload_config is None:
                log.warning("config.reload_unavailable",
                            hint="this daemon was started without a config source")
                return
            try:
                new = await trio.to_thread.run_sync(self.reload_config)
            except ConfigError as exc:
                log.error("config.reload_failed", error=str(exc),
                          hint="fix the file and send SIGHUP again; nothing was changed")
                return
            config = self.daemon.config
            result = apply_reload(config, new)
            if {"log_format", "log_level"} & set(result.changed):
                configure(config.log_format, config.log_level)
            for key in result.refused:
                log.warning("config.reload_refused", key=key, kept=_show(getattr(config, key)),
                            wanted=_show(getattr(new, key)),
                            hint=f"{key} changes only with a restart of dshd")
            log.info("config.reloaded", changed=result.changed, refused=result.refused)
        finally:
            self.notifier.send("READY=1")
            self._send_status(force=True)


def _show(value: object) -> object:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


if __name__ == "__main__":  # systemd/install.sh: the TimeoutStopSec= it renders into the units
    print(unit_timeout_stop_sec())
