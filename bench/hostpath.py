"""The call host's write path, variant by variant: CPU-s per GiB of each way to move a pipe's
bytes into the log and count its lines (issue 14, room bulk: "measure each idea").

Theory of operation: a real producer (``seq``, or a generated build log repeated by ``cat``)
writes into a real pipe of the host's size (1 MiB, ``F_SETPIPE_SZ``); this process plays the
host's loop -- the same read size (1 MiB) and the same pacing (a read under 256 KiB pauses
2 ms) -- with one variant of the write path, into a real file under /tmp that is fsync'd once
a second and at the end, like the host's log. CPU is this process's own (``getrusage``,
user + system; the producer is a child and not counted). Variants, in interleaved rounds:

* ``host``: what the host does (:class:`dshd.callhost.log.LogWriter` -- ``os.read``, its
  ``count_newlines``, ``os.write``);
* ``readv``: ``os.readv`` into one reused ``bytearray`` (no allocation, no page faults per
  read), the same count on it, ``os.write`` of a view;
* ``splice``: ``os.splice`` from the pipe into the file (no copy through user space), then
  ``os.preadv`` of the same bytes from the page cache into a reused buffer to count them;
* ``nocount``: ``host`` without the count (what exact ``totalLines`` costs is the difference);
* ``splice+numpy`` (only when numpy imports; it is not a dependency, and the host runs
  ``python3 -I -S``): ``os.splice``, then a vectorised count on an ``mmap`` of the page cache
  (no copy at all) -- the design that would close the CPU goal, measured.

Every variant's total is checked against ``bytes.count`` of the source. Prints median and
min..max over the rounds. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from dshd.callhost import log

from .host import build_log

PIPE_SIZE = 1 << 20
READ = 1 << 20
PACE_BELOW = 256 * 1024


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Sink:
    """The log file, fsync'd at most once a second and at the end."""

    def __init__(self, directory: str, append: bool) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | (os.O_APPEND if append else 0)
        self.path = os.path.join(directory, "out")
        self.fd = os.open(self.path, flags, 0o600)
        self.synced = time.monotonic()

    def tick(self) -> None:
        if time.monotonic() - self.synced >= 1.0:
            os.fsync(self.fd)
            self.synced = time.monotonic()

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)
        os.unlink(self.path)


def _loop(r: int, sink: _Sink, step) -> tuple[int, int]:
    total = lines = 0
    while True:
        n, counted = step(r, sink, total)
        if not n:
            return total, lines
        total += n
        lines += counted
        sink.tick()
        if n < PACE_BELOW:
            time.sleep(0.002)


def _host_step(r, sink, total):
    data = os.read(r, READ)
    if data:
        os.write(sink.fd, data)
    return len(data), log.count_newlines(data) if data else 0


def _nocount_step(r, sink, total):
    data = os.read(r, READ)
    if data:
        os.write(sink.fd, data)
    return len(data), 0


def _count_buf(buf: bytearray, n: int) -> int:
    """``count_newlines`` of ``buf[:n]`` without copying for the dense method (the sparse one,
    ``replace``, copies once, like the host's; a short read's slice adds one more)."""
    if n >= 65536 and buf.count(b"\n", 0, 4096) < 4096 // log.SPARSE_NEWLINES:
        return n - len((buf if n == len(buf) else buf[:n]).replace(b"\n", b""))
    return buf.count(b"\n", 0, n)


def _readv_step(r, sink, total, buf=bytearray(READ)):
    n = os.readv(r, [buf])
    if not n:
        return 0, 0
    os.write(sink.fd, memoryview(buf)[:n])
    return n, _count_buf(buf, n)


def _splice_step(r, sink, total, buf=bytearray(READ)):
    n = os.splice(r, sink.fd, READ, offset_dst=total)
    if not n:
        return 0, 0
    got = os.preadv(sink.fd, [memoryview(buf)[:n]], total)
    return n, _count_buf(buf, got)


def _splice_numpy_step(r, sink, total):
    import numpy  # noqa: PLC0415 -- optional, the design probe only
    n = os.splice(r, sink.fd, READ, offset_dst=total)
    if not n:
        return 0, 0
    start = total - total % mmap.PAGESIZE
    with mmap.mmap(sink.fd, total + n - start, mmap.MAP_SHARED, mmap.PROT_READ,
                   offset=start) as mm:
        view = numpy.frombuffer(mm, numpy.uint8)[total - start:]
        counted = int(numpy.count_nonzero(view == 10))
        del view
    return n, counted


VARIANTS = {"host": (_host_step, True), "readv": (_readv_step, True),
            "splice": (_splice_step, False), "nocount": (_nocount_step, True),
            "splice+numpy": (_splice_numpy_step, False)}


def run_once(cmd: str, variant: str) -> tuple[float, int, int]:
    """(CPU-s of this process, bytes, lines) for one pass of ``cmd`` through ``variant``."""
    step, append = VARIANTS[variant]
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass
    producer = subprocess.Popen(["sh", "-c", cmd], stdout=w)
    os.close(w)
    with tempfile.TemporaryDirectory(prefix="dsb-path-") as directory:
        sink = _Sink(directory, append)
        c0 = _cpu()
        total, lines = _loop(r, sink, step)
        sink.close()
        cpu = _cpu() - c0
    os.close(r)
    producer.wait()
    return cpu, total, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hostpath", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="16 MiB, 1 round (a smoke run)")
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    size, rounds = (16 << 20, 1) if args.quick else (max(1, args.size_mib) << 20, max(1, args.rounds))
    variants = [v for v in VARIANTS if v != "splice+numpy"]
    try:
        import numpy  # noqa: F401, PLC0415
        variants.append("splice+numpy")
    except ImportError:
        print("(numpy is not importable: the splice+numpy design probe is left out)")
    with tempfile.TemporaryDirectory(prefix="dsb-src-") as src:
        blog = os.path.join(src, "buildlog.txt")
        with open(blog, "wb") as f:
            f.write(build_log(32 << 20))
        sources = {"seq": f"seq 1 999999999 | head -c {size}",
                   "buildlog": f"while cat {blog}; do :; done | head -c {size}"}
        want = {}
        for name, cmd in sources.items():
            data = subprocess.run(["sh", "-c", cmd], capture_output=True, check=True).stdout
            want[name] = (len(data), data.count(b"\n"))
        cpu: dict = {(s, v): [] for s in sources for v in variants}
        for r in range(rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for name, cmd in sources.items():
                for v in order:
                    seconds, total, lines = run_once(cmd, v)
                    if total != want[name][0] or (v != "nocount" and lines != want[name][1]):
                        raise AssertionError(f"{v} on {name}: {total} bytes {lines} lines, "
                                             f"want {want[name]}")
                    cpu[(name, v)].append(seconds / (total / (1 << 30)))
    print(f"host write path, {size >> 20} MiB per run, CPU-s/GiB of the loop (user+sys), "
          f"median [min..max] of {rounds} interleaved rounds:")
    for (name, v), values in cpu.items():
        print(f"  {name:<9} {v:<13} {statistics.median(values):5.2f} "
              f"[{min(values):.2f}..{max(values):.2f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
