"""``python -m dshd fsck --offline``: the offline check as a command (STORAGE.md §5).

Theory of operation: parse the arguments (argparse), resolve the state directory as the
daemon does (``--state-dir``, else ``$DSH_STATE_DIR``, else the user's: `dshd.paths`), warn
when a running dshd holds it, judge each session with `fsck.check_offline` (which never
writes) and print one line per session -- ``<session>\\t<verdict>`` on stdout (coloured on a
terminal) or, with ``--json``, one JSON array at the end -- and a summary on stderr.

The output and exit statuses are those of ``dsh fsck --offline``, which runs this command
(the thin client does not read logs itself): 0 when no session is damaged or unchecked, 1
when one is or when the state directory or the named session does not exist (or the id is
invalid), 2 for a usage error, 141 when stdout is a closed pipe. The lines on stderr start
with ``dsh:`` for that reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from protocol.printable import printable

from ..paths import state_dir as resolve_state_dir
from . import fsck

__all__ = ["main"]

EXIT_BROKEN_PIPE = 141
STYLES = {"ok": "green", "repaired": "yellow", "torn": "yellow", "needs-repair": "yellow",
          "damaged": "bold red", "unchecked": "red"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dshd fsck",
        description="Check the sessions' logs without a daemon: ok, torn, needs repair, or "
        "damaged (exit 1 when any is damaged). Reads the logs and never writes.",
    )
    parser.add_argument("--offline", action="store_true", required=True,
                        help="read the logs directly (required: the check through a running "
                        "dshd is `dsh fsck`)")
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help="the state directory (default: $DSH_STATE_DIR, else the user's)")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.add_argument("session_id", metavar="SESSION", nargs="?", default=None)
    return parser


def _print_styled(line: str, style: str, *, stderr: bool) -> None:
    from rich.console import Console  # only for output that is shown: a terminal's colours
    from rich.text import Text

    console = Console(stderr=stderr, highlight=False, markup=False, soft_wrap=True)
    console.print(Text(line, style=style))


def _note(message: str, style: str = "") -> None:
    """One line on stderr; what came from the logs in it is shown escaped."""
    _print_styled(printable(message, keep="\n\t"), style, stderr=True)


def _emit(text: str) -> None:
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        out.flush()
        buffer.write(text.encode("utf-8", "replace"))
        buffer.flush()
    else:
        out.write(text)
        out.flush()


def _is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _silence_stdout() -> None:
    """After EPIPE, keep the interpreter's final flush of stdout from complaining."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _judge(args: argparse.Namespace, verdicts: list[fsck.Verdict]) -> int | None:
    """Judge the sessions, printing each line (unless JSON); an exit status on an error."""
    root = resolve_state_dir(args.state_dir)
    try:
        ids = fsck.offline_ids(root, args.session_id)
    except (FileNotFoundError, ValueError) as exc:
        _note(f"dsh: {exc.strerror}: {exc.filename}" if isinstance(exc, OSError) else f"dsh: {exc}")
        return 1
    if fsck.daemon_holds(root):
        _note(f"dsh: a running dshd holds {root}: a log it is writing may look torn, and its "
              "running calls show as needing repair")
    tty = _is_tty()
    for sid in ids:
        verdict = fsck.check_offline(root, sid)
        verdicts.append(verdict)
        if args.json:
            continue
        line = printable(verdict.session_id) + "\t" + printable(verdict.text())
        if tty:
            _print_styled(line, STYLES.get(verdict.state, ""), stderr=False)
        else:
            _emit(line + "\n")
    return None


def _summary(verdicts: list[fsck.Verdict]) -> str:
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict.state] = counts.get(verdict.state, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    return (f"fsck: {len(verdicts)} session{'' if len(verdicts) == 1 else 's'}"
            + (f": {summary}" if summary else ""))


def main(argv: list[str] | None = None) -> int:
    """Run the offline check on ``argv`` (without the ``fsck`` word); returns the exit status
    (argparse exits 2 itself on a usage error)."""
    args = _parser().parse_args(argv)
    verdicts: list[fsck.Verdict] = []
    try:
        code = _judge(args, verdicts)
        if code is not None:
            return code
        if args.json:
            value: Any = [v.to_json() for v in verdicts]
            _emit(json.dumps(value, ensure_ascii=False, sort_keys=False) + "\n")
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    _note(_summary(verdicts), "dim")
    return 1 if any(v.failed for v in verdicts) else 0
