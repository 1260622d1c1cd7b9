"""``dsh fsck``: is each session's log ok, repaired, or damaged (STORAGE.md §5)?

Theory of operation: through dshd (the default) the sessions are listed and each one is opened
with ``session.get`` -- opening a session after a crash is what repairs it -- and judged by
``client.fsck`` (``fsck_online``); one line per session, then a summary on stderr; exit 1 when
any is damaged or unchecked (``client.exits.fsck_status``). ``--offline`` reads the logs
without a daemon: the daemon's package owns its storage format, so this command runs
``python -m dshd fsck --offline [--state-dir DIR] [--json] [SESSION]`` with this interpreter,
its output and exit status passing straight through; the client never reads the files.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Callable

import click
from rich.text import Text

from client import fsck as _fsck
from client.api import Client
from client.cli.common import Options, execute, json_flag, pass_options
from client.cli.terminal import emit, is_tty, note, print_json, stdout
from client.exits import EXIT_ERROR, fsck_status
from protocol.printable import printable
from protocol.methods import SessionInfo
from protocol.rpc import STORAGE_FAILURE, RpcError

__all__ = ["fsck", "fsck_online", "offline_command"]

_FSCK_STYLES = {"ok": "green", "repaired": "yellow", "damaged": "bold red", "unchecked": "red"}
_RUN_FSCK = " (run `dsh fsck`)"


async def fsck_online(client: Client, session_id: str | None,
                      report: Callable[[_fsck.Verdict], None]) -> None:
    """Judge the sessions through dshd (``client.fsck``): list, then open each one."""
    rows = await client.list_sessions()
    if session_id is not None:
        rows = [r for r in rows if r.session_id == session_id]
        if not rows:
            await client.get_session(session_id)  # the daemon's own "not found" error
            rows = [SessionInfo(session_id=session_id)]  # listed before: nothing to compare
    for row in rows:
        report(await _judge(client, row))


async def _judge(client: Client, row: SessionInfo) -> _fsck.Verdict:
    sid = row.session_id
    if row.damaged:
        reason = row.damaged
        reason = reason[: -len(_RUN_FSCK)] if reason.endswith(_RUN_FSCK) else reason
        return _fsck.Verdict(sid, "damaged", reason)
    try:
        info = await client.get_session(sid)  # opens it: a crashed session is repaired now
    except RpcError as exc:
        out_of_fds = isinstance(exc.data, dict) and exc.data.get("code") == "TOO_MANY_FILES"
        state = "damaged" if exc.code == STORAGE_FAILURE and not out_of_fds else "unchecked"
        return _fsck.Verdict(sid, state, exc.message)
    before, after = row.last_seq, info.last_seq  # UNSET when not known
    repairs: list[str] = []
    if isinstance(before, int) and isinstance(after, int) and after > before:
        repairs = _fsck.repairs_in([e async for e in client.iter_events(sid, before)])
    return _fsck.Verdict(sid, "repaired" if repairs else "ok", repairs=repairs)


def offline_command(state_dir: str | None, session_id: str | None, as_json: bool) -> list[str]:
    """The daemon package's offline check, run with this interpreter."""
    argv = [sys.executable, "-m", "dshd", "fsck", "--offline"]
    if state_dir is not None:
        argv += ["--state-dir", state_dir]
    if as_json:
        argv.append("--json")
    if session_id is not None:
        argv += ["--", session_id]
    return argv


def _run_offline(argv: list[str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        done = subprocess.run(argv, check=False)
    except OSError as exc:
        note(f"dsh: cannot run {argv[0]} -m dshd: {exc.strerror or exc}")
        return EXIT_ERROR
    return done.returncode if done.returncode >= 0 else 128 - done.returncode


@click.command()
@click.argument("session_id", metavar="[SESSION]", required=False)
@click.option("--offline", is_flag=True,
              help="Read the logs directly, without dshd (never writes; dshd need not run).")
@click.option("--state-dir", "state_dir", metavar="DIR", default=None,
              help="With --offline: the state directory (default: $DSH_STATE_DIR, else the "
                   "user's).")
@json_flag
@pass_options
def fsck(opts: Options, session_id: str | None, offline: bool, state_dir: str | None,
         as_json: bool) -> None:
    """Check the sessions' logs: ok, repaired, or damaged (exit 1 when any is damaged).

    Through dshd, opening a session repairs it after a crash (calls that never settled get
    TOOL_OUTCOME_UNKNOWN or TOOL_NOT_STARTED results, pending approvals are cancelled): fsck
    says what was repaired. --offline reads the logs itself and reports torn tails (the records
    recovered), damage (its byte offset) and what the daemon would repair.
    """
    if state_dir is not None and not offline:
        raise click.UsageError("--state-dir is for --offline (dshd knows its own state directory)")
    to_json = as_json or opts.json
    if offline:
        sys.exit(_run_offline(offline_command(state_dir, session_id, to_json)))
    verdicts: list[_fsck.Verdict] = []
    tty = is_tty()

    def report(verdict: _fsck.Verdict) -> None:
        verdicts.append(verdict)
        if to_json:
            return
        line = printable(f"{verdict.session_id}") + "\t" + printable(verdict.text())
        if tty:
            stdout().print(Text(line, style=_FSCK_STYLES.get(verdict.state, "")))
        else:
            emit(line + "\n")

    code = execute(opts, lambda c: fsck_online(c, session_id, report))
    if code:
        sys.exit(code)
    if to_json:
        print_json([v.to_json() for v in verdicts])
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict.state] = counts.get(verdict.state, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    note(f"fsck: {len(verdicts)} session{'' if len(verdicts) == 1 else 's'}"
         + (f": {summary}" if summary else ""), "dim")
    sys.exit(fsck_status(any(v.failed for v in verdicts)))
