"""The call host's entry point: ``python3 -I -S /abs/path/dshd/callhost/main.py`` (HOST.md §2).

Theory of operation: the runner starts this script with a pipe as stdin and stdout, the
call's ``host.log`` as stderr, and its own session. The script puts its own directory on
``sys.path`` (``-I`` leaves it off) and imports every sibling module at once, before anything
else happens, so a dshd upgrade that replaces these files never changes a running host. Then:

1. read the spec (one JSON object) from stdin to EOF (bounded), validate it; a spec the host
   cannot use is answered ``{"ok": false, "error": ...}`` and nothing starts;
2. fork: this process (the runner's child, which the runner reaps) exits at once; the
   grandchild -- the host proper -- is re-parented to the nearest subreaper or pid 1, so no
   daemon thread is its parent. It is in the session this process leads, but not its leader,
   so opening a PTY can never make the host's own controlling terminal;
3. the host: SIGHUP/SIGINT ignored, ``PR_SET_CHILD_SUBREAPER`` (orphans of the command come
   to it), the control socket (``control.sock`` in the call directory), the first log segment,
   the command's spawn, ``host.json`` (atomic, 0600: with what a restarted daemon needs to
   adopt the host, :func:`host_record`), then ONE JSON line on stdout --
   ``{"ok": true, "pid", "startTime", "control", "commandPid"}`` -- and stdin/stdout pointed
   at ``/dev/null``: the host keeps no daemon descriptor, only its stderr (``host.log``);
4. the loop (:class:`host.Host`) until the command ended, ``exit.json`` is durable and the
   daemon released it (or ``linger`` passed).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ctypes  # noqa: E402 -- every import at start-up (see the module doc)
import json  # noqa: E402
import signal  # noqa: E402

import child  # noqa: E402,F401 -- loaded now, used by host
import control  # noqa: E402,F401
import host  # noqa: E402
import log  # noqa: E402
import loop  # noqa: E402
import spec as specs  # noqa: E402
import stdin  # noqa: E402,F401
import tree  # noqa: E402,F401

#: prctl option: become the child subreaper of every descendant.
PR_SET_CHILD_SUBREAPER = 36


def _answer(obj: dict) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _read_spec() -> dict:
    chunks, size = [], 0
    while True:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        size += len(chunk)
        if size > specs.SPEC_MAX:
            raise specs.SpecError(f"the spec is larger than {specs.SPEC_MAX} bytes")
        chunks.append(chunk)
    try:
        raw = json.loads(b"".join(chunks))
    except ValueError as exc:
        raise specs.SpecError(f"the spec is not JSON ({exc})") from None
    return specs.validate(raw)


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[19])


def _subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(code)}")


def _detach_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(0, 1)  # last: the runner's end of the pipe reads EOF once nothing else is left


def host_record(spec: dict, pid: int, start_time: int, command_pid: int | None) -> dict:
    """``host.json`` (HOST.md §3): how to find, check and reach this host, and what a daemon
    that adopts it after a restart needs (HOST.md §7): the control secret, the run's token,
    the wrapper to spare, the command's uid and pid, and the spec's opaque ``daemon`` value.
    The file is 0600 (``spec.write_json``), in the daemon's own 0700 call directory."""
    return {
        "version": 1, "pid": pid, "startTime": start_time, "control": control.SOCKET_NAME,
        "segmentBytes": spec["segment_bytes"], "tty": spec["tty"] is not None,
        "stdin": spec["stdin"], "secret": spec["secret"], "tokenVar": spec["token_var"],
        "token": spec["token"], "spareWrapper": spec["spare_wrapper"],
        "uid": spec["user"]["uid"] if spec["user"] else os.geteuid(),
        "commandPid": command_pid, "killGrace": spec["kill_grace"],
        "onDaemonLoss": spec["on_daemon_loss"], "daemon": spec["daemon"],
        "bootId": tree.boot_id(),
    }


def _host(spec: dict) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.chdir("/")  # pin no mount
    try:
        _subreaper()
        name = control.SOCKET_NAME
        listener = control.listen_in(spec["dir"])
        writer = log.LogWriter(spec["dir"], spec["segment_bytes"])
        pid = os.getpid()
        start_time = _start_time(pid)
        sigpipe = loop.SignalPipe()
        the_host = host.Host(spec, writer, listener, loop.Reactor())
        command_pid = the_host.start()
        specs.write_json(spec["dir"], "host.json", host_record(spec, pid, start_time,
                                                               command_pid), durable=False)
    except OSError as exc:
        _answer({"ok": False, "error": f"the call host could not start: {exc}"})
        return 1
    try:
        _answer({"ok": True, "pid": pid, "startTime": start_time, "control": name,
                 "commandPid": command_pid})
    except OSError:
        pass  # the runner is gone (the daemon died): run on, a restarted daemon finds host.json
    _detach_stdio()
    try:
        the_host.run(sigpipe)
    except BaseException:  # a bug: say so in host.log, and leave no orphan behind
        import traceback  # stdlib, only on this path: it costs every start-up ~9 ms
        os.write(2, f"dsh-host: crashed:\n{traceback.format_exc()}".encode())
        the_host.kill_everything()
        return 70
    finally:
        try:
            os.unlink(os.path.join(spec["dir"], control.SOCKET_NAME))
        except OSError:
            pass
    return 0


def main() -> int:
    try:
        spec = _read_spec()
    except specs.SpecError as exc:
        try:
            _answer({"ok": False, "error": str(exc)})
        except OSError:  # the runner is gone too (a daemon killed as it started the host)
            os.write(2, f"dsh-host: {exc}; the runner went away before the answer\n".encode())
        return 2
    if os.getsid(0) != os.getpid():
        os.setsid()
    if os.fork() != 0:
        os._exit(0)  # the intermediate: the runner reaps it
    try:
        code = _host(spec)
    except BaseException as exc:  # noqa: BLE001 -- say why in host.log, then go
        os.write(2, f"dsh-host: {type(exc).__name__}: {exc}\n".encode())
        os._exit(70)
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
