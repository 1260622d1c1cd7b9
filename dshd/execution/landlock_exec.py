"""Landlock launcher: confine this process with Landlock, then exec the command (EXEC.md §3).

Theory of operation
-------------------
Landlock confines the *calling thread* and everything it later forks or execs; it cannot be put
on another process. So the daemon never restricts itself: the Landlock provider
(:mod:`dshd.execution.sandbox_landlock`) wraps a command as ::

    <python> -I -S <this file> --rules-json '<json>' -- argv...

and this small program, running as the command's process-group leader, does in order:

0. **Take the workspace**: the inherited pinned fd (or, without one, an ``O_PATH`` open of the
   path), checked against the ``(st_dev, st_ino)`` dshd saw (:func:`open_workspace`), and
   ``fchdir`` to it; its rule in step 3 goes on that fd. A mismatch fails closed.
1. **Garbage-collect** per-call temporary directories left under ``tmp_root`` by earlier calls
   whose process group is gone (at most :data:`GC_LIMIT` per launch, unconfined, before step 4;
   the daemon's event loop never waits for it). Only names of the form this launcher makes
   (:data:`TMP_NAME`) are considered; any other name is left alone and never stops a launch.
2. **Make a private temporary directory** ``<tmp_root>/<pgid>-<random>`` (mode 0700) and point
   ``TMPDIR`` at it. Landlock cannot give a process its own ``/tmp`` the way a mount namespace
   does; instead the rest of ``/tmp`` stays read-only and this directory is writable.
3. **Build the ruleset** for the kernel's ABI (queried with ``landlock_create_ruleset(NULL, 0,
   LANDLOCK_CREATE_RULESET_VERSION)``): every filesystem right the ABI knows is *handled*
   (denied unless a rule allows it); ``read`` trees get execute + read-file + read-dir;
   ``write`` trees (the workspace in ``workspace-write``, the private temporary directory) get
   every right; the ``devices`` (``/dev/null``, ``/dev/zero``…) get read/write/truncate/ioctl.
   From ABI 4, TCP bind and connect are handled with no port allowed when ``deny_tcp``; from
   ABI 6, abstract Unix sockets and signals are scoped to the sandbox.
4. **Restrict**: ``prctl(PR_SET_NO_NEW_PRIVS)``; when the process holds capabilities (the
   daemon runs as root) drop the whole bounding set so that the exec'd program gets none;
   ``landlock_restrict_self``; install the seccomp socket filter
   (:func:`dshd.execution.landlock_seccomp.socket_filter`:
   no ``AF_UNIX`` sockets — so no way to dshd's socket or any host service — and, with the
   network off, no UDP or other non-TCP IP sockets; no io_uring; no 32-bit syscalls), which
   every descendant inherits and none can remove; clear the ambient and inheritable sets.
5. **Arm the parent-death signal** (below), then **exec** ``argv`` with ``os.execvp`` (same
   pid, same process group, same environment plus ``TMPDIR``: ``DSH_CALL_ID``/``DSH_SESSION_ID`` pass through).

**Dies with the daemon.** Landlock has no pid namespace that would end the command with the
daemon (bwrap's does), so right before the exec the launcher sets ``PR_SET_PDEATHSIG(SIGKILL)`` — kept
across the exec, so the command itself is SIGKILLed when the daemon dies, ``kill -9``
included — and then checks that its parent is still the process that started it
(``getppid()`` read at the launcher's start-up; a parent already gone: exit
:data:`EXIT_SETUP_FAILED`, the command never runs). The signal fires when the *thread* that
forked the launcher exits: the daemon spawns from its event-loop thread (the main thread, see
``dshd.execution.spawn.spawn``), which lives as long as the daemon. It reaches only the
launcher's process (the command after the exec): the command's own children (the grandchildren
of a killed shell, a ``nohup`` or ``setsid`` child) are re-parented and survive a killed
daemon, until the per-call host owns the whole tree as subreaper. A parent that dies during
the launcher's interpreter start-up, before ``getppid()`` is read, is not noticed (a window of
a few milliseconds). The launcher starts no thread — which also matters because Landlock
confines only the calling thread, so a single-threaded launcher is the whole process — and
after the exec the command is the process-group leader itself, so the runner's SIGTERM
reaches it directly. A script longer than
fits in argv arrives as an inherited memfd (``bash /dev/fd/N``); Landlock does not restrict
opening it (a memfd lives on an internal mount, outside every rule).

It fails closed: any error before the exec prints one line on stderr and exits with
:data:`EXIT_SETUP_FAILED` — the command never runs unconfined. A missing program exits 127.

This module is imported by the daemon for its constants and :func:`landlock_abi`, and must stay
stdlib-only: the provider runs it by path with ``-I -S`` (no site-packages, no current directory
on ``sys.path``, no ``PYTHON*`` variables), so a ``dshd/`` planted in a workspace cannot shadow
it and startup costs ~15 ms. ``python -m dshd.execution.landlock_exec`` works too (slower). Its
one sibling, the seccomp filter (:mod:`dshd.execution.landlock_seccomp`, stdlib-only too), is
then loaded by the path of this file's own directory (:func:`_load_sibling`), never through
``sys.path``.

Syscall numbers 444–446 are the unified numbers every Linux architecture except alpha uses.
"""

from __future__ import annotations

import os

#: The launcher's parent at its start-up (the daemon), read before anything else: see
#: :func:`die_with_parent`.
_PARENT_AT_START = os.getppid()

import ctypes  # noqa: E402 (the parent is read first)
import errno  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import secrets  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402


def _load_sibling(name: str):
    """The module in ``<name>.py`` next to this file, loaded by that path.

    Run as ``python -I -S <this file>`` the launcher has no ``sys.path`` entry for its own
    directory (``-I``: not the script's directory, not the current one), and must not get one:
    a ``dshd/`` or a module planted in a workspace must not shadow the launcher's code. So a
    sibling is loaded from the directory of this file's real path -- the same trusted place
    the launcher itself was read from -- under a name of its own.
    """
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_dsh_launcher_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __package__:  # imported as dshd.execution.landlock_exec (the daemon; python -m)
    from . import landlock_seccomp as seccomp
else:  # run by path with -I -S (the provider): load the sibling by its path
    seccomp = _load_sibling("landlock_seccomp")

socket_filter = seccomp.socket_filter
SECCOMP_ARCHES = seccomp.SECCOMP_ARCHES

SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
SIGKILL = 9
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
CAP_SETPCAP = 8

# Filesystem access rights (struct landlock_path_beneath_attr.allowed_access).
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
# Network access rights (ABI 4).
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
# Scopes (ABI 6).
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

#: Filesystem rights by the ABI that introduced them (ABI 4 and 6–8 added none).
FS_RIGHTS_BY_ABI = {
    1: (1 << 13) - 1,
    2: FS_REFER,
    3: FS_TRUNCATE,
    5: FS_IOCTL_DEV,
}
#: Highest ABI whose filesystem rights this launcher knows; a newer kernel is used at this level
#: (rights added later, such as ABI 9's Unix-socket connect right, are not handled).
KNOWN_ABI = 8
#: Rights that a rule on a regular file (not a directory) may carry.
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_RIGHTS = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
DEVICE_RIGHTS = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV

#: Exit status when the sandbox cannot be set up (the command did not run).
EXIT_SETUP_FAILED = 126
#: Stale per-call temporary directories removed per launch, at most.
GC_LIMIT = 8



class LandlockError(Exception):
    """The sandbox could not be set up; the message is one sentence."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def landlock_abi() -> tuple[int, int]:
    """``(abi, errno)``: the kernel's Landlock ABI version, or ``(0, errno)`` when unavailable.

    ``ENOSYS``: the kernel has no Landlock; ``EOPNOTSUPP``: built but not enabled at boot
    (``lsm=`` lacks ``landlock``); ``EPERM``: a seccomp filter (container) refuses the call.
    """
    libc = _libc()
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 0:
        return 0, ctypes.get_errno()
    return int(abi), 0


def handled_fs(abi: int) -> int:
    """Every filesystem right ABI ``abi`` knows (capped at :data:`KNOWN_ABI`)."""
    rights = 0
    for introduced, bits in FS_RIGHTS_BY_ABI.items():
        if abi >= introduced:
            rights |= bits
    return rights


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _fail(what: str, err: int) -> LandlockError:
    return LandlockError(f"{what}: {os.strerror(err)}")


def restrict(
    *,
    read: list[str],
    write: list[str],
    devices: list[str],
    deny_tcp: bool,
    pinned: list[tuple[int, bool]] = (),
) -> int:
    """Confine the calling thread (and its future children); returns the ABI used.

    ``read``/``write``: directory trees (absolute paths) given read+execute / every right;
    ``devices``: files given read/write/truncate/ioctl (missing ones are skipped).
    ``deny_tcp``: handle TCP bind/connect with no port allowed (ABI ≥ 4; ignored below).
    ``pinned``: ``(fd, writable)`` of directories already opened (the workspace, checked by
    :func:`open_workspace`): the rule goes on that fd, not on a path looked up again.
    Raises :class:`LandlockError` when any step fails — nothing is half-applied that matters,
    since the caller must then not exec.
    """
    abi, err = landlock_abi()
    if abi < 1:
        raise _fail("Landlock is not available in this kernel", err)
    abi = min(abi, KNOWN_ABI)
    libc = _libc()
    fs = handled_fs(abi)
    attr = _RulesetAttr(handled_access_fs=fs)
    size = 8
    if abi >= 4:
        size = 16
        if deny_tcp:
            attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
    if abi >= 6:
        size = 24
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    ruleset_fd = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                              ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset_fd < 0:
        raise _fail("landlock_create_ruleset failed", ctypes.get_errno())
    try:
        rules = [(p, READ_RIGHTS, False) for p in read] + [(p, fs, False) for p in write]
        rules += [(p, DEVICE_RIGHTS, True) for p in devices]
        for path, rights, optional in rules:
            _add_path_rule(libc, ruleset_fd, path, rights & fs, optional)
        for fd, writable in pinned:
            _add_fd_rule(libc, ruleset_fd, fd, (fs if writable else READ_RIGHTS) & fs,
                         "the workspace")
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _fail("prctl(PR_SET_NO_NEW_PRIVS) failed", ctypes.get_errno())
        _drop_bounding_set(libc)
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset_fd),
                        ctypes.c_uint32(0)) < 0:
            raise _fail("landlock_restrict_self failed", ctypes.get_errno())
    finally:
        os.close(ruleset_fd)
    try:
        seccomp.apply_socket_filter(libc, deny_inet=deny_tcp, tcp_ruled=abi >= 4)
    except seccomp.SeccompError as exc:
        raise LandlockError(str(exc)) from None
    _clear_capabilities(libc)
    return abi


def _add_path_rule(libc: ctypes.CDLL, ruleset_fd: int, path: str, rights: int,
                   optional: bool) -> None:
    """One ``LANDLOCK_RULE_PATH_BENEATH`` rule; a file (not a directory) keeps file rights only.
    A missing ``optional`` path is skipped."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        if optional:
            return
        raise LandlockError(f"cannot open {path} for a Landlock rule: no such file or directory")
    except OSError as exc:
        raise LandlockError(f"cannot open {path} for a Landlock rule: {exc.strerror}") from None
    try:
        _add_fd_rule(libc, ruleset_fd, fd, rights, path)
    finally:
        os.close(fd)


def _add_fd_rule(libc: ctypes.CDLL, ruleset_fd: int, fd: int, rights: int, shown: str) -> None:
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        rights &= FILE_RIGHTS
    rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
    if libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset_fd),
                    ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule),
                    ctypes.c_uint32(0)) < 0:
        raise _fail(f"landlock_add_rule for {shown} failed", ctypes.get_errno())


def open_workspace(spec: dict) -> tuple[int, bool]:
    """Open the workspace ``{"path", "dev", "ino", "write", "fd"?}`` — or take the inherited
    ``fd`` — and check it is the directory dshd checked (same ``(st_dev, st_ino)``); returns
    ``(O_PATH fd, writable)``. A path swapped
    since (a directory renamed for a symlink) raises :class:`LandlockError` naming the path."""
    path = spec["path"]
    if not isinstance(path, str) or not os.path.isabs(path):
        raise LandlockError(f"the workspace {path!r} is not an absolute path")
    if spec.get("fd") is not None:  # inherited from dshd, which pinned and checked it
        fd = int(spec["fd"])
        os.set_inheritable(fd, False)  # never reaches the command
    else:
        try:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise LandlockError(f"cannot open the workspace {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (int(spec["dev"]), int(spec["ino"])):
        os.close(fd)
        raise LandlockError(
            f"the workspace {path} is no longer the directory dshd checked (a directory in "
            "its path was renamed or replaced since): refusing to run"
        )
    return fd, bool(spec.get("write"))



def _effective_capabilities() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _drop_bounding_set(libc: ctypes.CDLL) -> None:
    """Drop every capability from the bounding set (needs CAP_SETPCAP, so only when held).

    With this and :func:`_clear_capabilities`, exec gives even a uid-0 process no capabilities
    (``no_new_privs`` also refuses file capabilities and set-uid bits), so Landlock is not the
    only wall between a root daemon's tool and the host (raw sockets, reboot, sysctl, clock).
    """
    if not _effective_capabilities() & (1 << CAP_SETPCAP):
        return
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except OSError:
        last = 63
    for cap in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err != errno.EINVAL:
                raise _fail(f"dropping capability {cap} from the bounding set failed", err)


def _clear_capabilities(libc: ctypes.CDLL) -> None:
    """Clear the ambient, inheritable, permitted and effective sets (the last step before exec)."""
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before 4.3: nothing
    header = _CapHeader(version=LINUX_CAPABILITY_VERSION_3, pid=0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise _fail("capset failed", ctypes.get_errno())


#: The names :func:`make_private_tmp` makes: ``<pgid>-<12 hex digits>``.
TMP_NAME = re.compile(r"([1-9][0-9]{0,9})-[0-9a-f]{12}")
#: Above the largest pid Linux allows (``PID_MAX_LIMIT`` is 2**22).
PGID_LIMIT = 1 << 22


def collect_garbage(tmp_root: str, limit: int = GC_LIMIT) -> int:
    """Remove up to ``limit`` directories ``<pgid>-<random>`` under ``tmp_root`` whose process
    group is gone; returns how many were removed. A reused pgid only delays a removal.

    Only names this launcher makes (:data:`TMP_NAME`, a pgid below :data:`PGID_LIMIT`) are
    considered; anything else there is left alone and never stops a launch."""
    removed = 0
    try:
        names = os.listdir(tmp_root)
    except OSError:
        return 0
    for name in names:
        if removed >= limit:
            break
        match = TMP_NAME.fullmatch(name)
        if match is None or int(match.group(1)) >= PGID_LIMIT:
            continue
        try:
            os.killpg(int(match.group(1)), 0)
            continue
        except ProcessLookupError:
            pass
        except (OSError, OverflowError, ValueError):
            continue  # exists (another user's?) or unknown: keep it
        shutil.rmtree(os.path.join(tmp_root, name), ignore_errors=True)
        removed += 1
    return removed


def make_private_tmp(tmp_root: str) -> str:
    """Create ``<tmp_root>/<pgid>-<random>`` (0700) and return its path."""
    os.makedirs(tmp_root, mode=0o700, exist_ok=True)
    path = os.path.join(tmp_root, f"{os.getpgid(0)}-{secrets.token_hex(6)}")
    os.mkdir(path, 0o700)
    return path


def die_with_parent(libc: ctypes.CDLL, parent: int) -> None:
    """``PR_SET_PDEATHSIG(SIGKILL)``, then check the parent is still ``parent`` (the signal is
    only armed for a parent alive when it is set). Raises :class:`LandlockError`."""
    if libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0:
        raise _fail("prctl(PR_SET_PDEATHSIG) failed", ctypes.get_errno())
    if os.getppid() != parent:
        raise LandlockError(f"the daemon (pid {parent}) that started this command is gone")


def main(args: list[str]) -> int:
    """``--rules-json JSON -- argv...``; execs argv (never returns) or returns an exit status.

    JSON: ``{"read": [dir...], "write": [dir...], "devices": [file...], "tmp_root": dir|null,
    "deny_tcp": bool, "workspace": {"path", "dev", "ino", "write"}|null}``. The workspace is
    opened and checked against ``dev``/``ino`` (:func:`open_workspace`), becomes the cwd
    (``fchdir``) and gets its rule through that fd.
    """
    if len(args) < 4 or args[0] != "--rules-json" or args[2] != "--":
        print("usage: landlock_exec --rules-json JSON -- argv...", file=sys.stderr)
        return 2
    argv = args[3:]
    try:
        rules = json.loads(args[1])
        write = list(rules.get("write", []))
        pinned = []
        if rules.get("workspace") is not None:
            fd, writable = open_workspace(rules["workspace"])
            os.fchdir(fd)  # the cwd is the directory checked, whatever its path names now
            pinned.append((fd, writable))
        tmp_root = rules.get("tmp_root")
        if tmp_root:
            collect_garbage(tmp_root)
            tmp = make_private_tmp(tmp_root)
            os.environ["TMPDIR"] = tmp
            write.append(tmp)
        restrict(
            read=list(rules.get("read", ["/"])),
            write=write,
            devices=list(rules.get("devices", [])),
            deny_tcp=bool(rules.get("deny_tcp", True)),
            pinned=pinned,
        )
        for fd, _ in pinned:
            os.close(fd)
        # Last, after every credential change of the setup (one that widened them would clear
        # it), right before the exec, which keeps it.
        die_with_parent(_libc(), _PARENT_AT_START)
    except (LandlockError, OSError, ValueError, TypeError, AttributeError, KeyError,
            OverflowError) as exc:
        print(f"dsh sandbox (landlock): the command was not run: {exc}", file=sys.stderr)
        return EXIT_SETUP_FAILED
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"dsh sandbox (landlock): {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else EXIT_SETUP_FAILED
    return EXIT_SETUP_FAILED  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
