"""The Landlock launcher's seccomp socket filter: what Landlock has no rules for (EXEC.md §3).

Theory of operation: Landlock (up to the ABIs this kernel has) cannot refuse a Unix socket's
``connect`` or any UDP traffic, so the launcher (:mod:`dshd.execution.landlock_exec`), after
``no_new_privs`` and ``landlock_restrict_self``, installs a classic-BPF seccomp program
(:func:`socket_filter`, assembled from labelled jumps by :func:`_assemble`) that every
descendant of the command inherits and none can remove: no ``AF_UNIX`` sockets, with the
network off only TCP among the IP sockets (Landlock's TCP rules then refuse it), no io_uring,
no syscalls of another ABI. :func:`apply_socket_filter` installs it on the calling thread.

Stdlib only, like the launcher, which loads this file by its own path when it runs as
``python -I -S landlock_exec.py`` (no ``sys.path`` entry for this directory). A failure is a
:class:`SeccompError` whose message is one sentence; the launcher reports it as its own.
"""

from __future__ import annotations

import ctypes
import errno
import os

__all__ = ["SECCOMP_ARCHES", "SeccompError", "apply_socket_filter", "socket_filter"]

# seccomp (the socket filter; Landlock has no rules for UDP or Unix sockets).
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JSET_K = 0x45
BPF_AND_K = 0x54
BPF_RET_K = 0x06
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM, SOCK_DGRAM = 1, 2
SOCK_TYPE_MASK = 0xF
IPPROTO_TCP = 6
X32_SYSCALL_BIT = 0x40000000
#: machine -> (AUDIT_ARCH_*, socket, socketpair, io_uring_setup) for the native syscall ABI.
SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, 41, 53, 425),
    "aarch64": (0xC00000B7, 198, 199, 425),
    "riscv64": (0xC00000F3, 198, 199, 425),
}



class SeccompError(Exception):
    """The filter could not be built or installed; the message is one sentence."""


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def socket_filter(machine: str, *, deny_inet: bool,
                  tcp_ruled: bool = True) -> list[tuple[int, int, int, int]]:
    r"""The classic-BPF seccomp program (``(code, jt, jf, k)`` tuples) for ``machine``.

    * ``socket(AF_UNIX, …)`` → ``EPERM`` always: no connecting to dshd's socket (at any path,
      guessed or not), D-Bus, systemd, docker or any other host service, and no abstract
      socket; ``socketpair`` stays (it connects to nobody) except ``SOCK_DGRAM``, which can be
      re-``connect``\ ed to a named datagram socket;
    * with ``deny_inet`` (no network): ``AF_INET``/``AF_INET6`` only as ``SOCK_STREAM`` with
      protocol 0 or TCP (Landlock's TCP rules then refuse connect and bind) — so no UDP, DNS,
      ICMP, SCTP or MPTCP — and of the other families only ``AF_NETLINK`` (local kernel
      queries); everything else → ``EPERM``. Without ``tcp_ruled`` (Landlock ABI < 4 has no
      TCP rules) no ``AF_INET``/``AF_INET6`` socket at all;
    * ``io_uring_setup`` → ``EPERM`` (io_uring's socket and connect operations bypass seccomp);
    * syscalls of another ABI (i386 ``int 0x80``, x32) → ``ENOSYS``: the filter cannot vet
      them (``socketcall``), so 32-bit programs do not run.

    Raises :class:`SeccompError` for a machine not in :data:`SECCOMP_ARCHES`.
    """
    if machine not in SECCOMP_ARCHES:
        raise SeccompError(f"no seccomp socket filter for this machine ({machine})")
    arch, nr_socket, nr_socketpair, nr_uring = SECCOMP_ARCHES[machine]
    allow = SECCOMP_RET_ALLOW
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    enosys = SECCOMP_RET_ERRNO | errno.ENOSYS
    arg = lambda i: 16 + 8 * i  # noqa: E731 — low 32 bits of seccomp_data.args[i] (LE)
    # Labels are resolved to relative jumps below: ("J", k, true_label, false_label).
    prog: list = [
        ("L", 4), ("J", arch, None, "nosys"),
        ("L", 0), ("S", X32_SYSCALL_BIT, "nosys", None),
        ("J", nr_socket, "socket", None),
        ("J", nr_socketpair, "socketpair", None),
        ("J", nr_uring, "deny", None),
        ("R", allow),
        "socket", ("L", arg(0)), ("J", AF_UNIX, "deny", None),
    ]
    if deny_inet and not tcp_ruled:
        prog += [("J", AF_NETLINK, "allow", "deny")]
    elif deny_inet:
        prog += [
            ("J", AF_INET, "inet", None), ("J", AF_INET6, "inet", None),
            ("J", AF_NETLINK, "allow", "deny"),
            "inet", ("L", arg(1)), ("A", SOCK_TYPE_MASK), ("J", SOCK_STREAM, None, "deny"),
            ("L", arg(2)), ("J", 0, "allow", None), ("J", IPPROTO_TCP, "allow", "deny"),
        ]
    else:
        prog += [("R", allow)]
    prog += [
        "socketpair", ("L", arg(0)), ("J", AF_UNIX, None, "allow"),
        ("L", arg(1)), ("A", SOCK_TYPE_MASK), ("J", SOCK_DGRAM, "deny", "allow"),
        "allow", ("R", allow),
        "deny", ("R", eperm),
        "nosys", ("R", enosys),
    ]
    return _assemble(prog)


def _assemble(prog: list) -> list[tuple[int, int, int, int]]:
    labels, index = {}, 0
    for item in prog:
        if isinstance(item, str):
            labels[item] = index
        else:
            index += 1
    out: list[tuple[int, int, int, int]] = []
    for item in prog:
        if isinstance(item, str):
            continue
        here = len(out)

        def rel(label: str | None) -> int:
            return 0 if label is None else labels[label] - here - 1

        op = item[0]
        if op == "L":
            out.append((BPF_LD_W_ABS, 0, 0, item[1]))
        elif op == "A":
            out.append((BPF_AND_K, 0, 0, item[1]))
        elif op == "R":
            out.append((BPF_RET_K, 0, 0, item[1]))
        else:
            code = BPF_JEQ_K if op == "J" else BPF_JSET_K
            out.append((code, rel(item[2]), rel(item[3]), item[1]))
    return out


def apply_socket_filter(libc: ctypes.CDLL, *, deny_inet: bool, tcp_ruled: bool) -> None:
    """Install :func:`socket_filter` on the calling thread (needs ``no_new_privs`` first)."""
    program = socket_filter(os.uname().machine, deny_inet=deny_inet, tcp_ruled=tcp_ruled)
    array = (_SockFilter * len(program))(*[_SockFilter(*ins) for ins in program])
    fprog = _SockFprog(len(program), ctypes.cast(array, ctypes.POINTER(_SockFilter)))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompError(f"installing the seccomp socket filter failed: {os.strerror(err)}")
