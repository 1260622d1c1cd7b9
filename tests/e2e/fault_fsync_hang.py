"""FAULT-INJECTION HOOK (tests only): run dshd with ``os.fsync`` made to hang.

``python fault_fsync_hang.py FLAG [dshd arguments...]`` runs the real ``dshd`` entry point
after replacing ``os.fsync`` (the call every session writer makes, in a worker thread) with one
that blocks for as long as the file FLAG exists, then does the real fsync. With FLAG absent it
is the real fsync, so the hook is inert until a test creates the file. Nothing in the ``dshd``
package knows about it: this wrapper is the only way in.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    flag, args = sys.argv[1], sys.argv[2:]
    real_fsync = os.fsync

    def hanging_fsync(fd: int) -> None:
        while os.path.exists(flag):
            time.sleep(0.05)
        real_fsync(fd)

    os.fsync = hanging_fsync
    from dshd.__main__ import main as dshd_main

    sys.argv = ["dshd", *args]
    dshd_main()


if __name__ == "__main__":
    main()
