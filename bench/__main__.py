"""Run every registered bench, or the ones named on the command line (``--quick``: small sizes)."""

from __future__ import annotations

import importlib
import sys

from . import BENCHES, QUICK_ARGV


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    names = [a for a in argv if a != "--quick"] or BENCHES
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown bench {unknown}; known: {BENCHES}", file=sys.stderr)
        return 2
    status = 0
    for name in names:
        print(f"== bench.{name}")
        module = importlib.import_module(f"bench.{name}")
        status |= module.main(QUICK_ARGV.get(name, []) if quick else []) or 0
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
