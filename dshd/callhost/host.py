"""The host proper: one command, its output log, its exit record, its control socket.

Theory of operation: :class:`Host` runs one single-threaded loop (:class:`loop.Reactor`) over
the output fd, the stdin end, the control listener and connections, and the SIGCHLD pipe,
with a handful of deadlines. Its life, in order:

1. **Start** (:meth:`Host.start`): the command is spawned (:mod:`child`); a spawn failure is
   an exit record with reason ``spawn-failed`` at once.
2. **Running**: each readable wake reads output (64 KiB asked, 1 MiB after a read pause or
   a full read; a PTY's ``EIO`` is end of file; the master then stays open, unread, until the
   child is reaped, since closing it would hang the terminal up and SIGHUP the exiting
   command) and appends it to the log (:mod:`log`), fsync'd at most once a second while output
   flows (a deadline catches the end of a burst). A small read within :data:`READ_PAUSE` of the
   previous one (a fast flow) sleeps that pause out. Attached connections get a ``progress``
   event (a fixed JSON line): the first of a burst at once, then at most one per 10 ms in the
   long run (two may go back to back), or per 20 ms while over 64 KiB arrive between two.
   ``timeout`` and ``terminate`` send TERM to the command's processes (the wrapper's own are
   spared: :func:`tree.signal_command`), after the grace SIGKILL to the whole tree.
3. **Draining**: once the direct child is reaped (the host reaps every orphan too: it is the
   subreaper), the host waits up to ``eof_grace`` for end of file, then -- always, even after
   end of file -- SIGKILLs every remaining descendant and the token's carriers, then reads on
   until end of file (what the killed holders wrote is still in the pipe) or
   :data:`DRAIN_SECONDS`, and closes the output: no ``sleep 30 &`` outlives the call.
   A log that cannot be written (``ENOSPC``, ``EFBIG``) stops the command like a
   ``terminate`` (reason ``killed``, the record's ``message`` says why); output is then read
   and dropped, so the command never blocks on a full pipe.
4. **Ended**: the log is fsync'd, then ``exit.json`` is written durably, then attached
   connections get the ``exit`` event. The host exits once a ``release`` came (before or
   after), or ``linger`` seconds after the end without one, after flushing its replies
   (bounded).

A request the state does not allow is refused with a code (``not-running`` after the end,
``no-stdin``, ``bad-request``); nothing a connection sends can stop the host.

The host's CPU per GiB of output is set by the work per byte (the pipe read, the line count,
the log write), not by Python: its own frames are ~5% of a cProfile of a flood. On the 2-core
VM of issue 14 (``python -m bench.hostpath``) this loop costs 1.7 CPU-s/GiB of `seq` and 1.2
of a build log, the count 0.8 and 0.4 of it; ``readv`` into one buffer and ``splice`` + a
``pread`` to count both cost more (2.2 and 1.8). At a slow flow the cost is per wake: ~190 µs
per line at 100 lines/s, the VM's floor ~100. ``DSH_HOST_PROFILE=<dir>`` (:data:`PROFILE_ENV`, benches only) runs the
loop under cProfile and leaves ``host-<pid>.prof`` there.
"""

from __future__ import annotations

import errno
import os
import signal
import time

try:
    from . import child, control, log, loop, spec as specs, stdin, tree
except ImportError:  # run as a script (main.py): the siblings are top-level modules
    import child
    import control
    import log
    import loop
    import spec as specs
    import stdin
    import tree

__all__ = ["Host"]

#: Bytes asked of the output fd per read after a pause or a read that filled its ask.
READ_CHUNK = 1_048_576
#: Bytes asked otherwise: under glibc's mmap threshold, so a slow flow's read buffer is heap
#: (a 1 MiB ask cost an mmap, an mremap and a munmap per line).
SMALL_READ = 65_536
#: A read shorter than this, less than READ_PAUSE after the previous read (a fast flow of
#: small writes), pauses reading for READ_PAUSE seconds (output pacing).
PACE_BELOW = 256 * 1024
READ_PAUSE = 0.002
#: Progress: at most one per PROGRESS_INTERVAL in the long run (the daemon's publish interval),
#: PROGRESS_BURST back to back (a producer's jitter around that rate delays no line).
PROGRESS_INTERVAL = 0.010
PROGRESS_BURST = 2
#: Past FLOOD_BYTES since the last event, at most one event per FLOOD_INTERVAL seconds.
FLOOD_BYTES = 64 * 1024
FLOOD_INTERVAL = 0.02
#: Minimum seconds between two fsyncs of the log while output flows.
SYNC_INTERVAL = 1.0
#: Seconds the host waits, after it decided to exit, for its replies to leave.
FLUSH_SECONDS = 1.0
#: An environment variable naming a directory: profile the host's loop there (benches only).
PROFILE_ENV = "DSH_HOST_PROFILE"
#: Seconds the output may take to reach end of file once the tree was killed (then it closes).
DRAIN_SECONDS = 2.0


class Host:
    """One call's host (see the module doc)."""

    def __init__(self, spec: dict, writer: log.LogWriter, listener, reactor) -> None:
        self.spec = spec
        self.log = writer
        self.listener = listener
        self.reactor = reactor
        self.conns: list[control.Connection] = []
        self.pid = os.getpid()
        self.child_pid: int | None = None
        self.child_alive = False
        self.status: int | None = None
        self.output_fd: int | None = None
        self.stdin: stdin.Stdin | None = None
        self.reason: str | None = None
        self.record: dict | None = None
        self.released = False
        self.log_error: str | None = None  # why the log could not be written, if it failed
        self.loss_message: str | None = None  # why the daemon's loss ended the command
        self._swept = False  # the remaining tree was killed after the child's exit
        self._output_eof = False  # the PTY reached end of file while the child still ran
        self.uid = spec["user"]["uid"] if spec["user"] else os.geteuid()
        now = time.monotonic()
        self.deadlines: dict[str, float] = {}
        self._last_progress = self._last_sync = now - 10.0
        self._progress_tat = now  # the progress bucket's theoretical arrival time (GCRA)
        self._last_read = now - 10.0  # when the output was last read
        self._read_ask = SMALL_READ  # bytes the next read asks for
        self._pause_until: float | None = None  # the output's read pause (a fast flow)
        self._progress_bytes = 0  # the log's end at the last progress event
        self._quit_at: float | None = None

    # -- start ---------------------------------------------------------------------------

    def start(self) -> int | None:
        """Spawn the command; returns its pid (None after a spawn failure)."""
        self.reactor.want_read(self.listener.fileno(), self._accept)
        try:
            spawned = child.spawn(self.spec)
        except child.SpawnFailure as exc:
            self._close_pass_fds()
            self.stdin = stdin.Stdin(self.reactor, None, False)
            self.stdin.ended = "not-running"
            self._finish({"exitCode": None, "signal": None, "reason": "spawn-failed",
                          "message": exc.message, "errno": exc.errno_name})
            return None
        self._close_pass_fds()
        self.child_pid, self.child_alive = spawned.pid, True
        self.output_fd = spawned.output_fd
        self.stdin = stdin.Stdin(self.reactor, spawned.stdin_fd, self.spec["tty"] is not None)
        self.reactor.want_read(self.output_fd, self._output)
        if self.spec["timeout"] is not None:
            self.deadlines["timeout"] = time.monotonic() + self.spec["timeout"]
        if self.spec["on_daemon_loss"] == "terminate":
            self.deadlines["attach"] = time.monotonic() + self.spec["attach_seconds"]
        return spawned.pid

    def _close_pass_fds(self) -> None:
        for fd in self.spec["pass_fds"]:
            try:
                os.close(fd)
            except OSError:
                pass

    # -- the loop ------------------------------------------------------------------------

    def run(self, sigpipe: loop.SignalPipe) -> None:
        """Run until the host may exit (see the module doc). With :data:`PROFILE_ENV` set to
        a directory (benches), the loop runs under cProfile and leaves
        ``host-<pid>.prof`` there."""
        where = os.environ.get(PROFILE_ENV)
        if not where:
            self._run(sigpipe)
            return
        import cProfile  # stdlib; only on this path
        profiler = cProfile.Profile()
        try:
            profiler.runcall(self._run, sigpipe)
        finally:
            profiler.dump_stats(os.path.join(where, f"host-{self.pid}.prof"))

    def _run(self, sigpipe: loop.SignalPipe) -> None:
        self.reactor.want_read(sigpipe.read_fd, lambda: (sigpipe.drain(), self._reap()))
        self._reap()
        while True:
            if self._pause_until is not None:
                self._pause()
            now = time.monotonic()
            if self._quit_at is not None and (
                    now >= self._quit_at or not any(c.pending_output for c in self.conns)):
                return
            wake = min(self.deadlines.values(), default=None)
            if wake is not None and wake <= now:
                for name, at in sorted(self.deadlines.items(), key=lambda kv: kv[1]):
                    if at <= now and self.deadlines.get(name) == at:
                        del self.deadlines[name]
                        getattr(self, f"_on_{name}")()
                wake = min(self.deadlines.values(), default=None)
            if self._quit_at is not None:
                wake = min(wake or self._quit_at, self._quit_at, now + 0.05)
            self.reactor.poll(None if wake is None else max(0.0, wake - time.monotonic()))

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child_pid and self.child_alive:
                self.child_alive, self.status = False, status
                self._child_exited()

    def _child_exited(self) -> None:
        self.deadlines.pop("timeout", None)
        self.deadlines.pop("kill", None)
        if self.stdin is not None:
            self.stdin.end("not-running", "the command has ended")
        if self._output_eof:
            self._close_output()
        if self.output_fd is None:
            self._end_output()
        else:
            self.deadlines["eof"] = time.monotonic() + self.spec["eof_grace"]

    # -- output --------------------------------------------------------------------------

    def _pause(self) -> None:
        """A fast flow's read pause (:meth:`_output`), slept out with the output fd registered
        (no epoll change); the connections, SIGCHLD and deadlines wait at most READ_PAUSE."""
        rest = self._pause_until - time.monotonic()
        self._pause_until = None
        self._read_ask = READ_CHUNK  # the pipe filled meanwhile
        if rest > 0:
            time.sleep(rest)

    def _output(self) -> None:
        ask = self._read_ask
        try:
            data = os.read(self.output_fd, ask)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno != errno.EIO:  # EIO: every holder of the PTY slave is gone
                os.write(2, f"dsh-host: reading the output failed: {exc}\n".encode())
            data = b""
        if not data:
            if self.child_alive and self.spec["tty"] is not None:
                # Keep the master open until the child is reaped: closing it hangs the
                # terminal up, and the kernel's SIGHUP kills a command between its last
                # close of the terminal and its exit (cat exited 129).
                self.reactor.want_read(self.output_fd, None)
                self._output_eof = True
                return
            self._close_output()
            if not self.child_alive:
                self._end_output()
            return
        now = time.monotonic()
        self._append(data, now)
        size = len(data)
        recent, self._last_read = now - self._last_read < READ_PAUSE, now
        self._read_ask = READ_CHUNK if size >= ask else SMALL_READ
        if size < PACE_BELOW and size < ask and recent and self.output_fd is not None:
            # A small read soon after another (a fast flow): let the pipe fill instead of
            # waking per write (a wake costs the same for 4 KiB as for 1 MiB; reading every few
            # KiB of `seq` cost ~2.6 host CPU-s/GiB). A read after a quiet gap (a slow flow)
            # never pauses: a lone line is not delayed. (Pausing after big reads too cost
            # more: 3.1-3.4 host CPU-s/GiB for a fast `cat` vs 1.4; issue 14.)
            self._pause_until = now + READ_PAUSE

    def _append(self, data: bytes, now: float) -> None:
        if self.log_error is not None:
            return  # the log failed: output is read and dropped while the command is stopped
        try:
            self.log.append(data)
        except OSError as exc:
            self._log_failed(exc)
            return
        if now - self._last_sync >= SYNC_INTERVAL:
            self._on_sync()
        else:
            self.deadlines.setdefault("sync", self._last_sync + SYNC_INTERVAL)
        # A few lines: report at once while the bucket allows (PROGRESS_BURST, refilled one
        # per PROGRESS_INTERVAL), else at the bucket's next slot; a flood: at most one report
        # per FLOOD_INTERVAL (each one costs the daemon a wake, whatever it carries).
        due = self._progress_tat - (PROGRESS_BURST - 1) * PROGRESS_INTERVAL
        if self.log.total_bytes - self._progress_bytes >= FLOOD_BYTES:
            due = max(due, self._last_progress + FLOOD_INTERVAL)
        if now >= due:
            self._on_progress()
        else:
            self.deadlines.setdefault("progress", due)

    def _close_output(self) -> None:
        if self.output_fd is None:
            return
        if self.stdin is not None and self.stdin.tty:
            self.stdin.end("not-running", "the terminal is closed")
        self.reactor.forget(self.output_fd)
        os.close(self.output_fd)
        self.output_fd = None

    def _log_failed(self, exc: OSError) -> None:
        self.log_error = (f"writing the output log failed ({exc.strerror or exc}) after "
                          f"{self.log.total_bytes} bytes; the command was stopped")
        os.write(2, f"dsh-host: {self.log_error}\n".encode())
        self.deadlines.pop("sync", None)
        if self.child_alive and "kill" not in self.deadlines:
            self._terminate("killed", self.spec["kill_grace"])

    def _end_output(self) -> None:
        """The child is gone: kill what is left of the tree (once), let the output reach end
        of file (bounded: :data:`DRAIN_SECONDS`), finish."""
        self.deadlines.pop("eof", None)
        if not self._swept:
            self._swept = True
            self._kill_tree(leader=None)
        if self.output_fd is not None:
            self.deadlines.setdefault("drain", time.monotonic() + DRAIN_SECONDS)
            return
        self.deadlines.pop("drain", None)
        self._finish(self._exit_fields())

    def _on_drain(self) -> None:
        self._close_output()
        self._end_output()

    def _exit_fields(self) -> dict:
        code = os.waitstatus_to_exitcode(self.status)
        sig = -code if code < 0 else None
        fields = {"exitCode": 128 + sig if sig else code, "signal": sig,
                  "reason": self.reason or "exited"}
        if self.log_error is not None:
            fields["message"] = self.log_error
        elif self.loss_message is not None and self.reason == "killed":
            fields["message"] = self.loss_message
        return fields

    def _finish(self, fields: dict) -> None:
        try:
            self.log.close()
        except OSError as exc:
            self._log_failed(exc)
            fields.setdefault("message", self.log_error)
        self.record = {"version": 1, **fields, "endedAt": time.time(),
                       "totalBytes": self.log.total_bytes, "totalLines": self.log.total_lines,
                       "firstOffset": self.log.first_offset}
        specs.write_json(self.spec["dir"], "exit.json", self.record, durable=True)
        self.deadlines.pop("sync", None)
        self.deadlines.pop("progress", None)
        for conn in list(self.conns):  # a send may close (and remove) a connection
            if conn.attached:
                conn.send_line(self._progress_line())
                conn.send({"event": "exit", "record": self.record})
        if self.released:
            self._quit()
        else:
            self.deadlines["linger"] = time.monotonic() + self.spec["linger"]

    def _quit(self) -> None:
        self.deadlines.clear()
        self.reactor.forget(self.listener.fileno())
        self._quit_at = time.monotonic() + FLUSH_SECONDS

    # -- deadlines -----------------------------------------------------------------------

    def _on_sync(self) -> None:
        self.deadlines.pop("sync", None)  # when called early, from _append
        self.log.sync()
        self._last_sync = time.monotonic()

    def _on_progress(self) -> None:
        self.deadlines.pop("progress", None)  # when called early, from _append
        self._last_progress = now = time.monotonic()
        self._progress_tat = max(self._progress_tat, now) + PROGRESS_INTERVAL
        self._progress_bytes = self.log.total_bytes
        line = self._progress_line()
        for conn in list(self.conns):
            if conn.attached:
                conn.send_line(line)

    def _on_timeout(self) -> None:
        if self.child_alive and self.reason is None:
            self._terminate("timeout", self.spec["kill_grace"])

    def _on_kill(self) -> None:
        if self.child_alive:
            self._kill_tree(leader=self.child_pid)

    def _on_eof(self) -> None:
        self._end_output()

    def _on_linger(self) -> None:
        self._quit()

    def _on_attach(self) -> None:
        self._daemon_lost("no daemon attached within "
                          f"{self.spec['attach_seconds']:g} s of the start")

    def _daemon_lost(self, why: str) -> None:
        """The daemon that owns this call is gone (``on_daemon_loss = "terminate"``): end the
        command as a stop would, so nothing runs on that nobody records (HOST.md §7)."""
        self.deadlines.pop("attach", None)
        if not self.child_alive or self.released or self.reason is not None:
            return
        self.loss_message = f"dshd went away while the command ran ({why}); the command was stopped"
        os.write(2, f"dsh-host: {self.loss_message}\n".encode())
        self._terminate("killed", self.spec["kill_grace"])

    def _terminate(self, reason: str, grace: float) -> None:
        self.reason = reason
        tree.signal_command(self.child_pid, signal.SIGTERM, self.spec["spare_wrapper"])
        self.deadlines["kill"] = time.monotonic() + grace

    def kill_everything(self) -> None:
        """SIGKILL the whole tree now (the host is going away on an unexpected error)."""
        self._kill_tree(leader=self.child_pid if self.child_alive else None)

    def _kill_tree(self, leader: int | None) -> None:
        marker = f"{self.spec['token_var']}={self.spec['token']}"
        tree.kill_tree(self.pid, leader, self.spec["spare_wrapper"], marker, self.uid)

    def _progress_line(self) -> bytes:
        """The ``progress`` event as its JSON line (a fixed template: no encoder per event)."""
        return b'{"event":"progress","endOffset":%d,"firstOffset":%d,"totalLines":%d}\n' % (
            self.log.total_bytes, self.log.first_offset, self.log.total_lines)

    def _progress(self) -> dict:
        return {"endOffset": self.log.total_bytes, "firstOffset": self.log.first_offset,
                "totalLines": self.log.total_lines}

    # -- control -------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(control.MAX_CONNECTIONS):  # what the backlog holds, then select again
            sock = control.accept_peer(self.listener)
            if sock is None:
                return
            self._admit(sock)

    def _admit(self, sock) -> None:
        now = time.monotonic()
        for conn in [c for c in self.conns if not c.greeted
                     and now - c.opened_at > control.HELLO_SECONDS]:
            conn.close()
        if len(self.conns) >= control.MAX_CONNECTIONS:
            silent = [c for c in self.conns if not c.greeted]
            if not silent:
                sock.close()
                return
            silent[0].close()
        self.conns.append(control.Connection(sock, self.reactor, self.spec["secret"],
                                             self._request, self._closed))

    def _closed(self, conn) -> None:
        if conn in self.conns:
            self.conns.remove(conn)
        if self.stdin is not None:
            self.stdin.drop(conn)
        if (conn.attached and self.spec["on_daemon_loss"] == "terminate"
                and not any(c.attached for c in self.conns)):
            self._daemon_lost("its control connection closed")

    def _state(self) -> dict:
        out = {"state": "exited" if self.record is not None else "running", **self._progress()}
        if self.record is not None:
            out["record"] = self.record
        return out

    def _request(self, conn, request_id: int, op: str, args: dict) -> dict | None:
        if op == "status":
            return {"ok": True, **self._state()}
        if op == "attach":
            conn.attached = True
            self.deadlines.pop("attach", None)
            if self.record is not None:  # after the reply: the exit event, once
                conn.after.append({"event": "exit", "record": self.record})
            return {"ok": True, "state": self._state()}
        if op == "release":
            self.released = True
            if self.record is not None:
                self._quit()
            return {"ok": True}
        if op in ("write", "close-stdin"):
            self.stdin.submit(conn, request_id, args.get("data") if op == "write" else None)
            return None
        if not self.child_alive:
            if op == "terminate" and self.record is None:
                self.deadlines["eof"] = time.monotonic()  # cut the eof wait short
                return {"ok": True}
            raise control.RequestError("not-running", "the command has ended")
        if op == "resize":
            if self.spec["tty"] is None or self.output_fd is None:
                raise control.RequestError("bad-request", "the call has no terminal")
            child.set_winsize(self.output_fd, args["cols"], args["rows"])
            return {"ok": True}
        if op == "signal":
            sig = getattr(signal, "SIG" + args["signal"])
            return {"ok": True, "signalled": tree.signal_command(
                self.child_pid, sig, self.spec["spare_wrapper"])}
        # terminate
        if self.reason is None or "kill" not in self.deadlines:
            self._terminate(args["reason"], args["grace"])
        else:
            self.reason = args["reason"]
            self.deadlines["kill"] = min(self.deadlines["kill"],
                                         time.monotonic() + args["grace"])
        return {"ok": True}
